//! Boots Kore + kore-appliance in service mode with the tiny pack preloaded and talks to it
//! over the VMM's hybrid vsock (`CONNECT 1025`): greedy answers equal kore-engine's on the
//! host, malformed JSON gets `bad_json` and the connection stays usable, concurrent
//! connections are all answered.

mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::client::{ids, Appliance, Client};
use common::{host_generate, tiny_pack, READY_MARKER};

#[test]
fn chat_service_over_vsock_matches_the_host_engine_and_survives_garbage() {
    let app = Appliance::boot("chat", 2);
    let mut c = Client::connect(&app.uds, Instant::now() + Duration::from_secs(120));
    let ready = app.vm.as_ref().unwrap().markers().into_iter().find(|(v, _)| *v == READY_MARKER);
    eprintln!("boot to ready (VMM start to ready marker): {:?}", ready.map(|(_, t)| t));
    assert!(app.console().contains("kore-appliance: ready vsock"), "{}", app.console());

    // Raw prompt ids, greedy: the streamed ids equal the host engine's.
    let prompt = [4071u32, 882, 198, 11];
    c.send(&json!({"id": "a", "prompt_ids": prompt, "max_tokens": 12}).to_string());
    let (text, done) = c.until_done(&json!("a"));
    assert_eq!(done["done"], json!(true), "{done}\n{}", app.console());
    let (want, finish) = host_generate(&prompt, 12);
    assert_eq!(ids(&done["token_ids"]), want, "{done}");
    assert_eq!(done["finish"], json!(finish));
    assert_eq!(done["text"].as_str(), Some(text.as_str()));

    // Garbage: an error, and the connection stays usable.
    c.send("this is { not json");
    let err = c.event();
    assert_eq!(err["id"], Value::Null, "{err}");
    assert_eq!(err["error"]["code"], json!("bad_json"), "{err}");

    // A text prompt on the same connection: tokenized in the guest, same greedy ids.
    let text_prompt = "ROMEO.\nBut soft, what light";
    c.send(&json!({"id": 2, "prompt": text_prompt, "max_tokens": 10}).to_string());
    let (_, done) = c.until_done(&json!(2));
    let tok = kore_tokenizer::Tokenizer::from_file(tiny_pack().join("tokenizer.json")).unwrap();
    let (want, _) = host_generate(&tok.encode(text_prompt), 10);
    assert_eq!(ids(&done["token_ids"]), want, "{done}");
    assert_eq!(done["stats"]["prompt_tokens"], json!(tok.encode(text_prompt).len()), "{done}");

    // Too long a prompt: an error before any work; the service keeps serving.
    let long = vec![11u32; 5000];
    c.send(&json!({"id": 3, "prompt_ids": long}).to_string());
    let err = c.event();
    assert_eq!(err["error"]["code"], json!("prompt_too_long"), "{err}");
    c.send(&json!({"op": "info", "id": 4}).to_string());
    let info = c.event();
    assert_eq!(info["info"]["vocab_size"], json!(4096), "{info}");
}

#[test]
fn concurrent_connections_are_all_answered() {
    const N: usize = 6;
    let app = Appliance::boot("concurrent", 2);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut clients: Vec<Client> = (0..N).map(|_| Client::connect(&app.uds, deadline)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(
            &json!({"id": i, "prompt_ids": [4071, 882 + i as u32], "max_tokens": 6}).to_string(),
        );
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let (_, done) = c.until_done(&json!(i));
        let (want, _) = host_generate(&[4071, 882 + i as u32], 6);
        assert_eq!(ids(&done["token_ids"]), want, "connection {i}: {done}\n{}", app.console());
    }
}
