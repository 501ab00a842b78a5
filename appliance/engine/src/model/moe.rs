//! The Qwen3.5 MoE feed-forward block (transformers' `Qwen3_5MoeSparseMoeBlock`)
//! that replaces the dense MLP in every layer of an MoE model:
//!
//! ```text
//! p      = softmax(router(x))                        [T, E]  (f32)
//! top    = the k largest p per token, w = p / sum(p over the k)
//! routed = sum over the k: w * down_e(silu(gate_e(x)) * up_e(x))
//! y      = routed + sigmoid(shared_expert_gate(x)) * shared_expert(x)
//! ```
//!
//! Only the routed experts' weights are read. The tokens of a forward (a
//! prefill chunk, one decode token, or every sequence's rows of a batched
//! step) are grouped by expert: each expert's gate/up and down run as one
//! product over all of its tokens, so its weights are read once per forward;
//! experts with the same token count share one pool run
//! ([`crate::kernels::Exec::matmuls`]). A token's result depends only on its own
//! row (the products keep one accumulator per token and the routed outputs
//! are summed in the token's top-k order), so batching changes no bit.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use super::{mlp_forward, Mlp};
use crate::config::{ModelConfig, MoeConfig};
use crate::kernels::{Exec, Product};
use crate::ops::{sigmoid, silu_mul, softmax};
use crate::tensor::TensorSource;
use crate::weights::{Linear, WeightError, WeightLoader};

/// One MoE block's weights.
#[derive(Debug)]
pub struct Moe<'a> {
    /// `mlp.gate`: the router, `[experts, hidden]`.
    pub router: Linear<'a>,
    /// `mlp.experts.N`: the routed SwiGLU experts.
    pub experts: Vec<Mlp<'a>>,
    /// `mlp.shared_expert`: the SwiGLU expert every token runs.
    pub shared_expert: Mlp<'a>,
    /// `mlp.shared_expert_gate`: `[1, hidden]`, sigmoid-gates the shared expert.
    pub shared_expert_gate: Linear<'a>,
    /// Experts per token.
    pub top_k: usize,
}

/// Routed-expert reads counted across forwards (see [`Moe::forward`]).
#[derive(Debug, Default)]
pub struct ExpertReads {
    /// Weight bytes of the routed experts read (each expert once per forward
    /// that routes any token to it).
    pub bytes: AtomicU64,
    /// Expert passes (an expert read in one forward counts once).
    pub passes: AtomicU64,
}

impl<'a> Moe<'a> {
    /// Loads `{p}.gate`, `{p}.experts.*`, `{p}.shared_expert.*` and
    /// `{p}.shared_expert_gate` (`p` ends in `.mlp`). Experts are read per
    /// expert (`experts.N.{gate,up,down}_proj`, dense or NVFP4) or from the
    /// fused tensors transformers keeps (`experts.gate_up_proj` `[E, 2I, H]`,
    /// `experts.down_proj` `[E, H, I]`, dense).
    pub fn load<S: TensorSource + ?Sized>(
        w: &WeightLoader<'a, S>,
        cfg: &ModelConfig,
        m: &MoeConfig,
        p: &str,
    ) -> Result<Self, WeightError> {
        let h = cfg.hidden_size;
        let experts = if w.has(&format!("{p}.experts.gate_up_proj")) {
            load_fused(w, m, h, p)?
        } else {
            (0..m.num_experts)
                .map(|e| load_swiglu(w, &format!("{p}.experts.{e}"), h, m.moe_intermediate_size))
                .collect::<Result<_, _>>()?
        };
        Ok(Moe {
            router: w.linear(&format!("{p}.gate"), m.num_experts, h)?,
            experts,
            shared_expert: load_swiglu(
                w,
                &format!("{p}.shared_expert"),
                h,
                m.shared_expert_intermediate_size,
            )?,
            shared_expert_gate: w.linear(&format!("{p}.shared_expert_gate"), 1, h)?,
            top_k: m.num_experts_per_tok,
        })
    }

    /// Weight bytes one token reads: router, shared expert and its gate, and
    /// `top_k` routed experts (the active parameters).
    pub fn active_bytes(&self) -> usize {
        self.router.weight_bytes()
            + self.shared_expert_gate.weight_bytes()
            + swiglu_bytes(&self.shared_expert)
            + self.routed_bytes_per_token()
    }

    /// Weight bytes of the `top_k` routed experts one token reads.
    pub fn routed_bytes_per_token(&self) -> usize {
        self.top_k * self.experts.iter().map(swiglu_bytes).max().unwrap_or(0)
    }

    /// The block over `x` (`[t, hidden]`, already normed); returns `[t, hidden]`.
    /// Adds the routed experts it read to `reads`.
    pub fn forward(&self, ex: Exec<'_>, x: &[f32], t: usize, reads: &ExpertReads) -> Vec<f32> {
        let (e, s) = (self.router.rows(), self.shared_expert.gate_proj.rows());
        let mut logits = vec![0.0; t * e];
        let mut sgate = vec![0.0; t];
        let (mut sg, mut su) = (vec![0.0; t * s], vec![0.0; t * s]);
        let shared = &self.shared_expert;
        ex.matmuls(
            t,
            &mut [
                Product::new(&self.router, x, &mut logits),
                Product::new(&self.shared_expert_gate, x, &mut sgate),
                Product::new(&shared.gate_proj, x, &mut sg),
                Product::new(&shared.up_proj, x, &mut su),
            ],
        );
        let routes = route(ex, &mut logits, e, self.top_k);
        let plan = Plan::new(&routes, e, self.top_k);
        let (ys, down) = self.run_experts(ex, &plan, x, (&mut sg, &su), t);
        reads.note(&plan, self);
        combine(&plan, &routes, &ys, &down, &sgate, self.top_k)
    }

    /// Every routed expert over its tokens (gate/up, SwiGLU, down), plus the
    /// shared expert's down projection; returns the routed outputs (rows in
    /// plan order) and the shared expert's output.
    fn run_experts(
        &self,
        exec: Exec<'_>,
        plan: &Plan,
        x: &[f32],
        (sg, su): (&mut [f32], &[f32]),
        t: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let h = x.len() / t.max(1);
        let inter = self.experts.first().map_or(0, |m| m.gate_proj.rows());
        let n = plan.rows.len();
        let mut xs = vec![0.0; n * h];
        for (row, &tok) in xs.chunks_exact_mut(h).zip(&plan.rows) {
            row.copy_from_slice(&x[tok as usize * h..(tok as usize + 1) * h]);
        }
        let (mut g, mut u) = (vec![0.0; n * inter], vec![0.0; n * inter]);
        {
            let xp = split(&xs, &plan.counts, h);
            let gp = split_mut(&mut g, &plan.counts, inter);
            let up = split_mut(&mut u, &plan.counts, inter);
            let mut groups: BTreeMap<usize, Vec<Product<'_, '_>>> = BTreeMap::new();
            for (((&(ex, c), xe), ge), ue) in plan.active.iter().zip(xp).zip(gp).zip(up) {
                let m = &self.experts[ex as usize];
                let v = groups.entry(c).or_default();
                v.push(Product::new(&m.gate_proj, xe, ge));
                v.push(Product::new(&m.up_proj, xe, ue));
            }
            for (c, mut products) in groups {
                exec.matmuls(c, &mut products);
            }
        }
        silu_mul(exec.path, &mut g, &u);
        silu_mul(exec.path, sg, su);
        let mut ys = vec![0.0; n * h];
        let mut down = vec![0.0; t * h];
        {
            let gp = split(&g, &plan.counts, inter);
            let yp = split_mut(&mut ys, &plan.counts, h);
            let mut groups: BTreeMap<usize, Vec<Product<'_, '_>>> = BTreeMap::new();
            for ((&(ex, c), ge), ye) in plan.active.iter().zip(gp).zip(yp) {
                let d = &self.experts[ex as usize].down_proj;
                groups.entry(c).or_default().push(Product::new(d, ge, ye));
            }
            let sd = Product::new(&self.shared_expert.down_proj, sg, &mut down);
            groups.entry(t).or_default().push(sd);
            for (c, mut products) in groups {
                exec.matmuls(c, &mut products);
            }
        }
        (ys, down)
    }
}

impl ExpertReads {
    fn note(&self, plan: &Plan, moe: &Moe<'_>) {
        let bytes: usize =
            plan.active.iter().map(|&(e, _)| swiglu_bytes(&moe.experts[e as usize])).sum();
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.passes.fetch_add(plan.active.len() as u64, Ordering::Relaxed);
    }
}

/// Per token, its `k` experts (descending probability; ties to the lower
/// index) and their weights renormalised to sum to 1, as
/// `Qwen3_5MoeTopKRouter` computes them. `logits` (`[t, e]`) become the
/// probabilities.
fn route(ex: Exec<'_>, logits: &mut [f32], e: usize, k: usize) -> Vec<(u32, f32)> {
    let mut out = Vec::with_capacity(logits.len() / e.max(1) * k);
    for p in logits.chunks_exact_mut(e) {
        softmax(ex.path, p);
        let first = out.len();
        for (i, &v) in p.iter().enumerate() {
            let top = &out[first..];
            if top.len() == k && top.last().is_some_and(|&(_, w): &(u32, f32)| v <= w) {
                continue;
            }
            if top.len() == k {
                out.pop();
            }
            let top = &out[first..];
            let at = first + top.iter().position(|&(_, w)| v > w).unwrap_or(top.len());
            out.insert(at, (i as u32, v));
        }
        let sum: f32 = out[first..].iter().map(|&(_, w)| w).sum();
        out[first..].iter_mut().for_each(|(_, w)| *w /= sum);
    }
    out
}

/// The routed rows grouped by expert: `rows` lists, expert after expert (in
/// index order), the tokens routed to it; `active` the experts with tokens
/// and their counts; `slot[i]` where assignment `i` (token `i / k`, its
/// `i % k`-th expert) sits in `rows`.
struct Plan {
    rows: Vec<u32>,
    active: Vec<(u32, usize)>,
    counts: Vec<usize>,
    slot: Vec<usize>,
}

impl Plan {
    fn new(routes: &[(u32, f32)], e: usize, k: usize) -> Self {
        let mut count = vec![0usize; e];
        routes.iter().for_each(|&(x, _)| count[x as usize] += 1);
        let mut start = vec![0usize; e];
        let mut acc = 0;
        for (s, c) in start.iter_mut().zip(&count) {
            *s = acc;
            acc += c;
        }
        let mut rows = vec![0u32; routes.len()];
        let mut slot = vec![0usize; routes.len()];
        let mut next = start.clone();
        for (i, &(x, _)) in routes.iter().enumerate() {
            let at = &mut next[x as usize];
            rows[*at] = (i / k.max(1)) as u32;
            slot[i] = *at;
            *at += 1;
        }
        let active: Vec<(u32, usize)> =
            count.iter().enumerate().filter(|(_, &c)| c > 0).map(|(x, &c)| (x as u32, c)).collect();
        let counts = active.iter().map(|&(_, c)| c).collect();
        Plan { rows, active, counts, slot }
    }
}

/// `y[t] = sum_j w_tj * ys[slot(t, j)] + sigmoid(gate[t]) * shared[t]`,
/// summed in the token's top-k order.
fn combine(
    plan: &Plan,
    routes: &[(u32, f32)],
    ys: &[f32],
    shared: &[f32],
    gate: &[f32],
    k: usize,
) -> Vec<f32> {
    let h = shared.len() / gate.len().max(1);
    let mut y = vec![0.0; shared.len()];
    for (tok, row) in y.chunks_exact_mut(h).enumerate() {
        for j in 0..k {
            let i = tok * k + j;
            let (w, at) = (routes[i].1, plan.slot[i] * h);
            for (o, v) in row.iter_mut().zip(&ys[at..at + h]) {
                *o += w * v;
            }
        }
        let g = sigmoid(gate[tok]);
        for (o, v) in row.iter_mut().zip(&shared[tok * h..(tok + 1) * h]) {
            *o += g * v;
        }
    }
    y
}

/// `buf` cut into consecutive parts of `counts[i] * width` values.
fn split<'b>(buf: &'b [f32], counts: &[usize], width: usize) -> Vec<&'b [f32]> {
    let mut rest = buf;
    counts
        .iter()
        .map(|&c| {
            let (a, b) = rest.split_at(c * width);
            rest = b;
            a
        })
        .collect()
}

/// [`split`], mutable.
fn split_mut<'b>(buf: &'b mut [f32], counts: &[usize], width: usize) -> Vec<&'b mut [f32]> {
    let mut rest = buf;
    counts
        .iter()
        .map(|&c| {
            let (a, b) = core::mem::take(&mut rest).split_at_mut(c * width);
            rest = b;
            a
        })
        .collect()
}

fn swiglu_bytes(m: &Mlp<'_>) -> usize {
    m.gate_proj.weight_bytes() + m.up_proj.weight_bytes() + m.down_proj.weight_bytes()
}

fn load_swiglu<'a, S: TensorSource + ?Sized>(
    w: &WeightLoader<'a, S>,
    p: &str,
    h: usize,
    i: usize,
) -> Result<Mlp<'a>, WeightError> {
    Ok(Mlp {
        gate_proj: w.linear(&format!("{p}.gate_proj"), i, h)?,
        up_proj: w.linear(&format!("{p}.up_proj"), i, h)?,
        down_proj: w.linear(&format!("{p}.down_proj"), h, i)?,
    })
}

/// Experts from transformers' fused tensors, borrowed: expert `e`'s gate is
/// rows `0..I` of `gate_up_proj[e]`, its up rows `I..2I`.
fn load_fused<'a, S: TensorSource + ?Sized>(
    w: &WeightLoader<'a, S>,
    m: &MoeConfig,
    h: usize,
    p: &str,
) -> Result<Vec<Mlp<'a>>, WeightError> {
    let (n, i) = (m.num_experts, m.moe_intermediate_size);
    let gate_up = w.stacked(&format!("{p}.experts.gate_up_proj"), n, 2 * i, h)?;
    let down = w.stacked(&format!("{p}.experts.down_proj"), n, h, i)?;
    Ok(gate_up
        .into_iter()
        .zip(down)
        .map(|(gu, down_proj)| Mlp {
            gate_proj: dense_rows(gu, 0, i),
            up_proj: dense_rows(gu, i, 2 * i),
            down_proj,
        })
        .collect())
}

/// Rows `r0..r1` of a dense Linear, borrowed.
fn dense_rows(l: Linear<'_>, r0: usize, r1: usize) -> Linear<'_> {
    match l {
        Linear::Dense { dtype, data, cols, .. } => {
            let es = dtype.size();
            let data = &data[r0 * cols * es..r1 * cols * es];
            Linear::Dense { dtype, data, rows: r1 - r0, cols }
        }
        other => other,
    }
}

/// A dense MLP or an MoE block: the feed-forward half of a layer.
#[derive(Debug)]
pub enum Ffn<'a> {
    /// SwiGLU MLP (dense models).
    Dense(Mlp<'a>),
    /// Mixture of experts (MoE models).
    Moe(Moe<'a>),
}

impl Ffn<'_> {
    /// The block over `x` (`[t, hidden]`, already normed).
    pub(crate) fn forward(
        &self,
        ex: Exec<'_>,
        x: &[f32],
        t: usize,
        reads: &ExpertReads,
    ) -> Vec<f32> {
        match self {
            Ffn::Dense(m) => mlp_forward(ex, m, x, t),
            Ffn::Moe(m) => m.forward(ex, x, t, reads),
        }
    }

    /// Weight bytes one token reads (all of a dense MLP).
    pub fn active_bytes(&self) -> usize {
        match self {
            Ffn::Dense(m) => swiglu_bytes(m),
            Ffn::Moe(m) => m.active_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic() -> Exec<'static> {
        Exec { pool: &crate::pool::Serial, path: crate::simd::Path::Generic }
    }

    #[test]
    fn routing_takes_the_top_k_renormalised_and_groups_by_expert() {
        // Two tokens over 4 experts, k = 2.
        let mut logits = vec![0.0, 2.0, 1.0, -1.0, 3.0, 0.0, 0.0, 3.5];
        let r = route(generic(), &mut logits, 4, 2);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 2, 3, 0]);
        let (a, b) = (1.0f32.exp(), 0.5f32.exp());
        assert!((r[0].1 - a / (a + 1.0)).abs() < 1e-6 && (r[1].1 - 1.0 / (a + 1.0)).abs() < 1e-6);
        assert!((r[2].1 - b / (b + 1.0)).abs() < 1e-6);
        let plan = Plan::new(&r, 4, 2);
        assert_eq!(plan.active, [(0, 1), (1, 1), (2, 1), (3, 1)]);
        assert_eq!(plan.rows, [1, 0, 0, 1]);
        assert_eq!(plan.slot, [1, 2, 3, 0]);
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let mut logits = vec![1.0; 6];
        let r = route(generic(), &mut logits, 6, 3);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(r.iter().all(|x| (x.1 - 1.0 / 3.0).abs() < 1e-6));
    }
}
