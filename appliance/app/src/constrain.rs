//! The vocabulary constrained decoding needs, from the served tokenizer.

use kore_grammar::Vocab;
use kore_tokenizer::Tokenizer;

/// The grammar vocabulary of `tokenizer` for a model of `vocab_size` ids:
/// every token's bytes, added tokens marked (for [`crate::ModelEngine::with_grammar_vocab`]).
pub fn grammar_vocab(tokenizer: &Tokenizer, vocab_size: usize) -> Vocab {
    let ids = 0..tokenizer.vocab_size().min(vocab_size) as u32;
    let tokens =
        ids.filter_map(|id| tokenizer.token_bytes(id).map(|b| (id, b, tokenizer.is_added(id))));
    Vocab::new(vocab_size, tokens)
}
