//! Safetensors header parsing: incremental prefixes and every validation error, on hand-built bytes.
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use florence2_wasm::weights::load::read_header;
use florence2_wasm::weights::{parse_header, HeaderState, MemSource, StDtype};
use florence2_wasm::Error;
use proptest::prelude::*;
use weights_util::*;

fn parse_full(bytes: &[u8]) -> Result<florence2_wasm::weights::Header, Error> {
    let mut src = MemSource::new("t.safetensors", bytes.to_vec());
    pollster::block_on(read_header(&mut src)).map(|(h, _)| h)
}

fn header_msg(e: Error) -> String {
    match e {
        Error::SafetensorsHeader { msg, .. } => msg,
        other => panic!("expected SafetensorsHeader, got {other:?}"),
    }
}

fn two_tensors() -> Vec<u8> {
    write_safetensors(
        &[
            RawTensor::new("a", Dt::F32, &[2, 3], &[1., 2., 3., 4., 5., 6.]),
            RawTensor::new("b", Dt::BF16, &[3], &[1., 2., 3.]),
        ],
        Some(serde_json::json!({"format": "pt"})),
    )
}

#[test]
fn parses_valid_file_and_metadata() {
    let f = two_tensors();
    let h = parse_full(&f).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.tensors[0].name, "a");
    assert_eq!(h.tensors[0].dtype, StDtype::F32);
    assert_eq!(h.tensors[0].shape, vec![2, 3]);
    assert_eq!((h.tensors[1].start, h.tensors[1].end), (24, 30));
    assert_eq!(h.metadata["format"], "pt");
    assert_eq!(h.data_start + h.data_len, f.len() as u64);
}

#[test]
fn prefixes_need_more_then_done() {
    let f = two_tensors();
    let n = u64::from_le_bytes(f[..8].try_into().unwrap());
    for len in 0..8 {
        assert!(matches!(
            parse_header(&f[..len], "t").unwrap(),
            HeaderState::NeedMore(8)
        ));
    }
    for len in 8..(8 + n as usize) {
        match parse_header(&f[..len], "t").unwrap() {
            HeaderState::NeedMore(t) => assert_eq!(t, 8 + n),
            HeaderState::Done(_) => panic!("done at {len}"),
        }
    }
    assert!(matches!(
        parse_header(&f[..8 + n as usize], "t").unwrap(),
        HeaderState::Done(_)
    ));
}

#[test]
fn truncated_file() {
    let f = two_tensors();
    // Cut inside the data: Truncated with the exact sizes.
    let cut = &f[..f.len() - 3];
    match parse_full(cut).unwrap_err() {
        Error::Truncated { expected, got, .. } => {
            assert_eq!(expected, f.len() as u64);
            assert_eq!(got, cut.len() as u64);
        }
        e => panic!("{e:?}"),
    }
    // Shorter than the length prefix.
    assert!(matches!(
        parse_full(&f[..5]).unwrap_err(),
        Error::Truncated { .. }
    ));
    // Trailing garbage is a header error.
    let mut long = f.clone();
    long.extend_from_slice(&[0, 0, 0, 0]);
    assert!(header_msg(parse_full(&long).unwrap_err()).contains("after the last tensor"));
}

#[test]
fn header_length_beyond_file_or_limit() {
    let mut f = two_tensors();
    let n = u64::from_le_bytes(f[..8].try_into().unwrap());
    f[..8].copy_from_slice(&(n + 1000).to_le_bytes());
    assert!(header_msg(parse_full(&f).unwrap_err()).contains("past the end"));
    f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(header_msg(parse_full(&f).unwrap_err()).contains("limit"));
    // The limit is enforced from the 8-byte prefix alone.
    assert!(parse_header(&f[..8], "t").is_err());
}

#[test]
fn non_json_and_non_object_headers() {
    for (h, want) in [
        ("{not json}", "JSON"),
        ("[1, 2, 3]", "not a JSON object"),
        ("{\"a\": 5}", "not an object"),
        (
            "{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}",
            "data_offsets",
        ),
        (
            "{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}",
            "dtype",
        ),
        (
            "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}",
            "dimension",
        ),
        ("{\"__metadata__\": {\"k\": 5}}", "__metadata__"),
    ] {
        let f = raw_file(h, &[0; 4]);
        let msg = header_msg(parse_full(&f).unwrap_err());
        assert!(msg.contains(want), "{h}: {msg}");
    }
    // Invalid UTF-8.
    let mut f = raw_file("{\"a\":1}", &[]);
    f[9] = 0xff;
    assert!(header_msg(parse_full(&f).unwrap_err()).contains("UTF-8"));
}

#[test]
fn offsets_sizes_overlaps_gaps() {
    let cases = [
        // Outside the data section: the header promises more bytes than the file has.
        (
            r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}"#,
            4,
            "truncated",
        ),
        // Size != numel * dtype size.
        (
            r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}"#,
            4,
            "needs 8",
        ),
        // Backwards range.
        (
            r#"{"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}}"#,
            4,
            "backwards",
        ),
        // Overlap.
        (
            r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}"#,
            12,
            "overlap",
        ),
        // Gap at the start and between tensors.
        (
            r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}"#,
            8,
            "gap",
        ),
        (
            r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}"#,
            12,
            "gap",
        ),
        // A U8 shape of 2^64 - 1 bytes passes every per-entry check; its end offset plus the header
        // length overflowed u64 in the file-length check (a panic in debug builds).
        (
            r#"{"a": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 18446744073709551615]}}"#,
            4,
            "past 2^64",
        ),
        (
            r#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                "b": {"dtype": "U8", "shape": [18446744073709551614], "data_offsets": [1, 18446744073709551615]}}"#,
            4,
            "past 2^64",
        ),
        // A name given twice is refused by name (the JSON parser used to keep the last one, so this read
        // as a "gap" before the second tensor).
        (
            r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}"#,
            8,
            "duplicate key \"a\"",
        ),
        // Element count overflow.
        (
            r#"{"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}}"#,
            4,
            "overflow",
        ),
    ];
    for (h, data_len, want) in cases {
        let f = raw_file(h, &vec![0u8; data_len]);
        let e = parse_full(&f).unwrap_err();
        let msg = match e {
            Error::SafetensorsHeader { msg, .. } => msg,
            Error::Truncated { .. } => "truncated".to_owned(),
            e => panic!("{h}: {e:?}"),
        };
        assert!(msg.contains(want), "{h}: {msg}");
    }
}

#[test]
fn unknown_dtype_is_unsupported() {
    let f = raw_file(
        r#"{"a": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}}"#,
        &[0],
    );
    match parse_full(&f).unwrap_err() {
        Error::UnsupportedDtype { name, dtype } => {
            assert_eq!((name.as_str(), dtype.as_str()), ("a", "Q4_K"))
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        Error::UnsupportedDtype {
            name: "a".into(),
            dtype: "I64".into()
        }
        .name(),
        "Florence2LoadError"
    );
    // Known non-float dtypes parse (their ranges are validated) and are rejected only when needed.
    let f = raw_file(
        r#"{"i": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}"#,
        &[0; 16],
    );
    assert_eq!(parse_full(&f).unwrap().tensors[0].dtype, StDtype::I64);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random valid files: every strict prefix of the header says NeedMore, the full header parses to the
    /// tensors that were written, and any byte cut from the end is reported as Truncated.
    #[test]
    fn random_files_roundtrip(shapes in prop::collection::vec(prop::collection::vec(0usize..5, 0..4), 1..6),
                              dts in prop::collection::vec(0u8..3, 6), cut in 1usize..16) {
        let raw: Vec<RawTensor> = shapes.iter().enumerate().map(|(i, s)| {
            let dt = [Dt::F32, Dt::F16, Dt::BF16][dts[i] as usize];
            let n: usize = s.iter().product();
            RawTensor::new(&format!("t{i}"), dt, s, &vec![0.5; n])
        }).collect();
        let f = write_safetensors(&raw, None);
        let h = parse_full(&f).unwrap();
        prop_assert_eq!(h.tensors.len(), raw.len());
        for t in &raw {
            let got = h.get(&t.name).unwrap();
            prop_assert_eq!(&got.shape, &t.shape);
            prop_assert_eq!(got.byte_len() as usize, t.bytes.len());
        }
        let end = h.data_start as usize;
        for len in [0, 7, 8, end / 2, end - 1] {
            let is_need_more = matches!(parse_header(&f[..len], "t").unwrap(), HeaderState::NeedMore(_));
            prop_assert!(is_need_more);
        }
        if h.data_len > 0 {
            let cut = cut.min(h.data_len as usize);
            let is_truncated = matches!(parse_full(&f[..f.len() - cut]), Err(Error::Truncated { .. }));
            prop_assert!(is_truncated);
        }
    }
}
