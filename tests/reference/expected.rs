//! The expected-tensor table derived from the base config must equal the reference key list of a real
//! HF-native base checkpoint (`reference/base_keys_grouped.txt`, read from the reference
//! directory), names and shapes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use florence2_wasm::config::tensors::expected_tensors;
use florence2_wasm::config::Florence2Config;
use florence2_wasm::weights::temporal_cosine_table;

fn reference(file: &str) -> PathBuf {
    crate::reference_file(file)
}

/// Expand `name  xN  [shape]` lines; `{a..b}` is a range, `{b}` a block index 0..N.
fn parse_grouped(text: &str) -> BTreeMap<String, Vec<usize>> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.split_whitespace();
        let name = parts.next().unwrap();
        let count: usize = parts
            .next()
            .unwrap()
            .trim_start_matches('x')
            .parse()
            .unwrap();
        let shape_s: String = parts.collect::<Vec<_>>().join("");
        let shape: Vec<usize> = shape_s
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|d| d.trim().parse().unwrap())
            .collect();
        let names: Vec<String> = if let Some(open) = name.find('{') {
            let close = name.find('}').unwrap();
            let inner = &name[open + 1..close];
            let range: Vec<usize> = match inner.split_once("..") {
                Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect(),
                None => (0..count).collect(),
            };
            assert_eq!(range.len(), count, "{line}");
            range
                .iter()
                .map(|i| format!("{}{i}{}", &name[..open], &name[close + 1..]))
                .collect()
        } else {
            assert_eq!(count, 1, "{line}");
            vec![name.to_owned()]
        };
        for n in names {
            assert!(
                out.insert(n, shape.clone()).is_none(),
                "duplicate in {line}"
            );
        }
    }
    out
}

#[test]
fn base_table_equals_reference_keys() {
    let cfg_text = std::fs::read_to_string(reference("base_config_hf_native.json")).unwrap();
    let cfg = Florence2Config::from_json_str(&cfg_text).unwrap();
    let want = parse_grouped(&std::fs::read_to_string(reference("base_keys_grouped.txt")).unwrap());
    let got: BTreeMap<String, Vec<usize>> = expected_tensors(&cfg).into_iter().collect();
    assert_eq!(got.len(), expected_tensors(&cfg).len(), "duplicate names");
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(missing.is_empty(), "table lacks {missing:?}");
    assert!(extra.is_empty(), "table has extra {extra:?}");
    for (n, s) in &want {
        assert_eq!(&got[n], s, "{n}");
    }
    eprintln!("{} tensors, names and shapes match", want.len());
}

#[test]
fn temporal_table_closed_form() {
    // Independent f64 evaluation of the reference formula; f32 evaluation differs by rounding only.
    let (n, c) = (100, 1024);
    let t = temporal_cosine_table(n, c);
    let half = c / 2;
    let mut max = 0f64;
    for p in 0..n {
        for k in 0..half {
            let w = (-(k as f64) * (10000f64).ln() / half as f64).exp();
            let a = p as f64 * w;
            max = max.max((t[p * c + 2 * k] as f64 - a.sin()).abs());
            max = max.max((t[p * c + 2 * k + 1] as f64 - a.cos()).abs());
        }
    }
    // Angles reach 99 rad: an f32 angle carries ~99 * 2^-24 ~ 6e-6 absolute error.
    eprintln!("temporal table vs f64: max |diff| = {max:.3e}");
    assert!(max < 2e-5, "{max}");
}

#[test]
fn every_reference_key_belongs_to_its_part() {
    // The weight format per part (`--dtype vision=fp16,text=q4`) picks each tensor's format by
    // `part_of`: every key of a real base checkpoint has a part, the parts hold the counts the config
    // implies (encoder layers 16 tensors each, decoder layers 26, each side's positions and embedding
    // norm 3; the projector 6; the shared embedding 1), and every original key's canonical name has
    // the part of its HF-native name.
    use florence2_wasm::weights::names::{canonical_name, Layout};
    use florence2_wasm::weights::{part_of, Part};
    let cfg_text = std::fs::read_to_string(reference("base_config_hf_native.json")).unwrap();
    let cfg = Florence2Config::from_json_str(&cfg_text).unwrap();
    let keys = parse_grouped(&std::fs::read_to_string(reference("base_keys_grouped.txt")).unwrap());
    let mut count: BTreeMap<Part, usize> = BTreeMap::new();
    for k in keys.keys() {
        let part = part_of(k).unwrap_or_else(|| panic!("{k} has no part"));
        *count.entry(part).or_default() += 1;
    }
    let t = &cfg.text;
    let vision = keys.len() - (16 * t.encoder_layers + 3) - (26 * t.decoder_layers + 3) - 6 - 1;
    let want = BTreeMap::from([
        (Part::Vision, vision),
        (Part::Projector, 6),
        (Part::Encoder, 16 * t.encoder_layers + 3),
        (Part::Decoder, 26 * t.decoder_layers + 3),
        (Part::Embed, 1),
    ]);
    assert_eq!(count, want);
    assert!(keys
        .keys()
        .filter(|k| part_of(k) == Some(Part::Vision))
        .all(|k| k.starts_with("model.vision_tower.")));
    let mapping = crate::weights_util::reference_mapping();
    for (orig, hf) in &mapping {
        let canonical = canonical_name(Layout::Original, orig).unwrap();
        assert_eq!(part_of(&canonical), part_of(hf), "{orig}");
        assert!(part_of(hf).is_some(), "{hf}");
    }
    eprintln!("{count:?}; {} original keys agree", mapping.len());
}
