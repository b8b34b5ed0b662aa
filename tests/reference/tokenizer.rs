//! Florence-2 tokenizer vs the real one.
//!
//! These tests READ the verified real Florence-2 tokenizer files from `<reference dir>/tokenizer/`
//! (relative to the crate root; reference data that may not be copied into the repository):
//! `florence2_tokenizer.json`, `florence2_hf_native_tokenizer.json` and `verification.json` (prompt
//! encodings and decodes from the reference test-suite). They FAIL, not skip, when the files are missing.
use florence2_wasm::processor::tokenizer::{
    florence_added_tokens, Florence2Tokenizer, FlorenceTokens,
};
use florence2_wasm::Error;
use serde_json::Value;

fn read_ref(name: &str) -> Vec<u8> {
    let path = crate::reference_file(&format!("tokenizer/{name}"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("reference file {} is required: {e}", path.display()))
}

fn verification() -> Value {
    serde_json::from_slice(&read_ref("verification.json")).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The original-layout file with only BART's base vocabulary: every added token with id >= the model
/// vocabulary size removed (what the original checkpoints' hub tokenizer.json holds).
fn base_only_json() -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&read_ref("florence2_tokenizer.json")).unwrap();
    let base = v["model"]["vocab"].as_object().unwrap().len() as u64;
    assert_eq!(base, 50265);
    let added = v["added_tokens"].as_array_mut().unwrap();
    added.retain(|t| t["id"].as_u64().unwrap() < base);
    assert_eq!(added.len(), 5, "<s> <pad> </s> <unk> <mask>");
    serde_json::to_vec(&v).unwrap()
}

/// Loaded once per test binary (parsing a 3.7 MB tokenizer.json takes ~1 s in a debug build).
fn tokenizers() -> &'static [(&'static str, Florence2Tokenizer)] {
    static TOKS: std::sync::OnceLock<Vec<(&'static str, Florence2Tokenizer)>> =
        std::sync::OnceLock::new();
    TOKS.get_or_init(load_all)
}

fn load_all() -> Vec<(&'static str, Florence2Tokenizer)> {
    vec![
        (
            "florence2_tokenizer.json",
            Florence2Tokenizer::from_json_bytes(&read_ref("florence2_tokenizer.json")).unwrap(),
        ),
        (
            "florence2_hf_native_tokenizer.json",
            Florence2Tokenizer::from_json_bytes(&read_ref("florence2_hf_native_tokenizer.json"))
                .unwrap(),
        ),
        (
            "base-vocab-only",
            Florence2Tokenizer::from_json_bytes(&base_only_json()).unwrap(),
        ),
    ]
}

#[test]
fn every_verification_encoding_matches_id_for_id() {
    let v = verification();
    let encode = v["encode"].as_array().unwrap();
    let extra = v["extra"].as_array().unwrap();
    assert!(encode.len() >= 9 && extra.len() >= 6);
    for (file, tok) in tokenizers() {
        let mut n = 0;
        for e in encode.iter().chain(extra) {
            let text = e["text"].as_str().unwrap();
            let want = ids(&e["ids"]);
            let got = tok.encode_prompt(text).unwrap();
            assert_eq!(got, want, "{file}: {text:?}");
            n += 1;
        }
        println!("{file}: {n} prompt encodings identical");
    }
}

#[test]
fn decode_round_trips_like_the_reference() {
    let v = verification();
    for (file, tok) in tokenizers() {
        // Full-id round trips recorded by the reference: special tokens kept, no spaces added.
        for e in v["extra"].as_array().unwrap() {
            let got = tok.decode(&ids(&e["ids"]), false).unwrap();
            assert_eq!(got, e["roundtrip"].as_str().unwrap(), "{file}");
        }
        for e in v["encode"].as_array().unwrap() {
            let text = e["text"].as_str().unwrap();
            let i = ids(&e["ids"]);
            assert_eq!(
                tok.decode(&i, false).unwrap(),
                format!("<s>{text}</s>"),
                "{file}"
            );
            assert_eq!(tok.decode(&i, true).unwrap(), text, "{file}");
        }
        // Generated sequences (only their first ids are recorded): our decode of the head is a prefix
        // of the reference's decode of the whole sequence.
        for e in v["decode"].as_array().unwrap() {
            let skip = e["skip_special_tokens"].as_bool().unwrap();
            let head = tok.decode(&ids(&e["ids_head"]), skip).unwrap();
            let full = e["text"].as_str().unwrap();
            let head = head.trim_end_matches('\u{FFFD}');
            assert!(
                !head.is_empty() && full.starts_with(head),
                "{file}: {head:?} vs {full:?}"
            );
        }
    }
}

#[test]
fn florence_tokens_have_reference_ids_in_every_file() {
    let toks = tokenizers();
    let wanted = florence_added_tokens();
    for (file, tok) in toks {
        for (i, t) in wanted.iter().enumerate() {
            assert_eq!(tok.token_to_id(t), Some(50265 + i as u32), "{file}: {t}");
            assert_eq!(
                tok.id_to_token(50265 + i as u32).as_deref(),
                Some(t.as_str()),
                "{file}"
            );
        }
        assert_eq!(tok.loc_token_range(), 50269..51269, "{file}");
        assert_eq!(tok.loc_bin(50269 + 417), Some(417));
        assert_eq!(tok.loc_bin(51269), None);
        assert_eq!(
            (tok.bos_id(), tok.eos_id(), tok.pad_id()),
            (0, 2, Some(1)),
            "{file}"
        );
    }
    // Both real files agree on every Florence token; the base-only file had them all added.
    for t in &wanted {
        assert_eq!(toks[0].1.token_to_id(t), toks[1].1.token_to_id(t));
    }
    assert_eq!(toks[0].1.florence_tokens(), FlorenceTokens::Present);
    assert_eq!(toks[1].1.florence_tokens(), FlorenceTokens::Present);
    assert_eq!(toks[2].1.florence_tokens(), FlorenceTokens::Added);
    assert_eq!(toks[0].1.vocab_size(), 51289);
    assert_eq!(toks[1].1.vocab_size(), 51290);
    assert_eq!(toks[2].1.vocab_size(), 51289);
    assert_eq!(toks[1].1.image_token_id(), Some(51289));
    assert_eq!(toks[0].1.image_token_id(), None);
    // Added tokens are special: skipped when asked, kept verbatim otherwise.
    let car = [0, 5901, 50322, 50602, 51202, 51043, 2];
    for (file, tok) in toks {
        assert_eq!(tok.decode(&car, true).unwrap(), "car", "{file}");
        assert_eq!(
            tok.decode(&car, false).unwrap(),
            "<s>car<loc_53><loc_333><loc_933><loc_774></s>",
            "{file}"
        );
    }
}

#[test]
fn truncation_and_padding_in_the_file_are_ignored() {
    let mut v: Value =
        serde_json::from_slice(&read_ref("florence2_hf_native_tokenizer.json")).unwrap();
    v["truncation"] = serde_json::json!({"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0});
    v["padding"] = serde_json::json!({"strategy": {"Fixed": 32}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 1, "pad_type_id": 0, "pad_token": "<pad>"});
    let tok = Florence2Tokenizer::from_json_bytes(&serde_json::to_vec(&v).unwrap()).unwrap();
    let got = tok.encode_prompt("What does the image describe?").unwrap();
    assert_eq!(got, vec![0, 2264, 473, 5, 2274, 6190, 116, 2]);
}

#[test]
fn partially_present_tokens_are_completed_and_broken_files_rejected() {
    // Drop `<and>` from a full file: it is appended, the others keep their ids.
    let mut v: Value = serde_json::from_slice(&read_ref("florence2_tokenizer.json")).unwrap();
    v["added_tokens"]
        .as_array_mut()
        .unwrap()
        .retain(|t| t["content"] != "<and>");
    let tok = Florence2Tokenizer::from_json_bytes(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(tok.florence_tokens(), FlorenceTokens::PartiallyAdded);
    assert_eq!(tok.token_to_id("</poly>"), Some(51287));
    assert!(tok.token_to_id("<and>").is_some());

    // Location tokens out of order: rejected (post-processing relies on a contiguous range).
    let mut v: Value = serde_json::from_slice(&read_ref("florence2_tokenizer.json")).unwrap();
    for t in v["added_tokens"].as_array_mut().unwrap() {
        if t["content"] == "<loc_5>" {
            t["content"] = "<loc_6>".into();
        } else if t["content"] == "<loc_6>" {
            t["content"] = "<loc_5>".into();
        }
    }
    let e = Florence2Tokenizer::from_json_bytes(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert!(matches!(e, Error::Tokenizer(_)), "{e}");
    assert_eq!(e.name(), "Florence2TokenizerError");

    // Truncated file.
    let bytes = read_ref("florence2_tokenizer.json");
    let e = Florence2Tokenizer::from_json_bytes(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(matches!(e, Error::Tokenizer(_)));
}

/// The fixtures' small BPE tokenizers (tests/fixtures/models/*/tokenizer.json: HF-native dirs carry all
/// Florence tokens, `-orig`/`-mlx-bf16` dirs only the 421 base tokens) vs the reference's ids and texts
/// in tests/fixtures/reference/<dir>/cases.json: `prompt_ids` from `constructed_prompt`, and every
/// result's `text` = decode(token_ids, skip_special_tokens = false).
#[test]
fn fixture_tokenizers_match_reference_cases() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let mut checked = 0;
    for dir in [
        "tiny2",
        "tiny2-orig",
        "tiny2-mlx-bf16",
        "tiny4",
        "tiny4-orig",
        "tiny4-f16-sharded",
    ] {
        let tok = Florence2Tokenizer::from_json_bytes(
            &std::fs::read(format!("{root}/models/{dir}/tokenizer.json")).unwrap(),
        )
        .unwrap();
        let expect = if dir.contains("orig") || dir.contains("mlx") {
            FlorenceTokens::Added
        } else {
            FlorenceTokens::Present
        };
        assert_eq!(tok.florence_tokens(), expect, "{dir}");
        assert_eq!(tok.loc_token_range(), 425..1425, "{dir}");
        let cases: Value = serde_json::from_slice(
            &std::fs::read(format!("{root}/reference/{dir}/cases.json")).unwrap(),
        )
        .unwrap();
        for c in cases.as_array().unwrap() {
            let prompt = c["constructed_prompt"].as_str().unwrap();
            assert_eq!(
                tok.encode_prompt(prompt).unwrap(),
                ids(&c["prompt_ids"]),
                "{dir}: {prompt}"
            );
            for (kind, r) in c["results"].as_object().unwrap() {
                let text = tok.decode(&ids(&r["token_ids"]), false).unwrap();
                assert_eq!(text, r["text"].as_str().unwrap(), "{dir} {kind}");
                checked += 1;
            }
        }
    }
    println!("{checked} reference decodes identical");
    assert!(checked > 0);
}
