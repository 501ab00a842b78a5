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
