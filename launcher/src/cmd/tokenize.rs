//! `kore-launch tokenize`: the model's `tokenizer.json` applied to a text, no
//! engine involved. Ids equal Hugging Face `tokenizers`' `encode(text).ids`
//! (special tokens written in the text are recognised).

use std::path::Path;

use kore_tokenizer::Tokenizer;

use crate::cli::TokenizeArgs;
use crate::error::{LaunchError, Result};

/// Runs the command.
pub fn run(args: TokenizeArgs) -> Result<()> {
    let model = crate::model::resolve(args.model.as_deref())?;
    let tokenizer = load(&model)?;
    if let Some(file) = &args.chat {
        return chat(tokenizer, &read_text(file)?, args.json.json);
    }
    let text = match (&args.text, &args.file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) => read_text(file)?,
        (None, None) => return Err(LaunchError::Usage("give --text TEXT or --file F".into())),
    };
    let ids = tokenizer.encode(&text);
    if args.json.json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", line.join(" "));
    }
    Ok(())
}

/// `--chat FILE`: the body's messages and tools rendered by the chat
/// template, as text (special tokens written out) and ids.
fn chat(tokenizer: Tokenizer, body: &str, json: bool) -> Result<()> {
    let (text, ids) = render_chat(tokenizer, body).map_err(LaunchError::Usage)?;
    if json {
        println!("{}", serde_json::json!({ "text": text, "ids": ids }));
    } else {
        print!("{text}");
    }
    Ok(())
}

/// Renders an OpenAI chat body as the service does (`kore_service::Codec`).
fn render_chat(
    tokenizer: Tokenizer,
    body: &str,
) -> std::result::Result<(String, Vec<u32>), String> {
    use kore_service::Codec;
    let req = crate::serve::chat_body(body)?;
    let tokenizer = std::sync::Arc::new(tokenizer);
    let codec = kore_appliance::TokenizerCodec::new(tokenizer.clone(), Vec::new());
    let messages = req.messages.as_deref().unwrap_or_default();
    let ids = codec
        .render_chat(messages, req.tools.as_ref(), req.thinking_on())
        .map_err(|e| format!("{e:?}"))?;
    Ok((tokenizer.decode(&ids), ids))
}

/// Loads `tokenizer.json` from a pack or Hugging Face directory (or the file itself).
fn load(model: &Path) -> Result<Tokenizer> {
    let path = crate::model::tokenizer_path(model);
    if !path.is_file() {
        return Err(LaunchError::Model(format!(
            "{}: no tokenizer.json (--model takes a pack or Hugging Face model directory)",
            path.display()
        )));
    }
    let bytes = std::fs::read(&path)
        .map_err(|source| LaunchError::Io { path: path.display().to_string(), source })?;
    Tokenizer::from_json(&bytes).map_err(|e| LaunchError::Model(format!("{}: {e}", path.display())))
}

fn read_text(file: &Path) -> Result<String> {
    let bytes = std::fs::read(file)
        .map_err(|source| LaunchError::Io { path: file.display().to_string(), source })?;
    String::from_utf8(bytes).map_err(|e| {
        LaunchError::Usage(format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            file.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/tokenizer/tests/data").join(name)
    }

    /// Every committed chat-template fixture (bodies rendered by
    /// transformers' apply_chat_template) renders to the same text; the ids
    /// are checked against the fixture's on the real Qwen3.5 vocabulary where
    /// it was generated (scripts/tokenizer, `qwen35-reference`), else they
    /// must decode to that text on the tiny pack's.
    #[test]
    fn chat_bodies_render_as_the_template_fixtures() {
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny");
        let real = fixture("generated/qwen3_5_tokenizer.json");
        let raw = std::fs::read_to_string(fixture("chat_template_qwen35.json")).unwrap();
        let fixtures: serde_json::Value = serde_json::from_str(&raw).unwrap();
        let cases = fixtures["cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for (i, case) in cases.iter().enumerate() {
            // The body's text as committed (its key order), not re-serialized.
            let body = body_text(&raw, i);
            let Some(want_text) = case["text"].as_str() else {
                // The template raises on this body: so must the renderer.
                let got = render_chat(load(&tiny).unwrap(), &body);
                assert!(got.is_err(), "{}: {got:?}", case["name"]);
                continue;
            };
            let (text, ids) = render_chat(load(&tiny).unwrap(), &body).unwrap();
            assert_eq!(text, want_text, "{}", case["name"]);
            if real.is_file() {
                let (text, ids) = render_chat(load(&real).unwrap(), &body).unwrap();
                let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
                assert_eq!(text, want_text, "{}", case["name"]);
                // By design message text never becomes a special token (HF
                // encodes a user's "</think>" as one): only such cases differ.
                let added = ["<think>", "</think>", "<tool_response>", "<tool_call>"];
                let special_text = added.iter().any(|a| body.contains(a));
                assert!(ids == want || special_text, "{}: {ids:?} != {want:?}", case["name"]);
            } else {
                assert_eq!(load(&tiny).unwrap().decode(&ids), want_text, "{}", case["name"]);
            }
        }
    }

    /// The text of case `i`'s `body` in the fixture file, as written.
    fn body_text(raw: &str, i: usize) -> String {
        let v = kore_grammar::json::Value::parse(raw).unwrap();
        let case = &v.get("cases").unwrap().as_array().unwrap()[i];
        case.get("body").unwrap().to_compact_json()
    }

    #[test]
    fn loads_a_directory_or_the_file() {
        let dir = std::env::temp_dir().join(format!("kore-tokenize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(fixture("small_tokenizer.json"), dir.join("tokenizer.json")).unwrap();
        let from_dir = load(&dir).unwrap();
        let from_file = load(&fixture("small_tokenizer.json")).unwrap();
        assert_eq!(from_dir.encode("Hello <|im_end|>"), from_file.encode("Hello <|im_end|>"));
        std::fs::write(dir.join("tokenizer.json"), b"{\"model\": [").unwrap();
        let err = load(&dir).unwrap_err().to_string();
        assert!(err.contains("malformed tokenizer.json") && !err.contains('\n'), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(load(Path::new("/nonexistent-model-dir"))
            .unwrap_err()
            .to_string()
            .contains("no tokenizer.json"));
    }

    #[test]
    fn rejects_non_utf8_files() {
        let path =
            std::env::temp_dir().join(format!("kore-tokenize-bad-{}.txt", std::process::id()));
        std::fs::write(&path, b"ok\xff").unwrap();
        let err = read_text(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(err.contains("not UTF-8") && err.contains("offset 2"), "{err}");
    }
}
