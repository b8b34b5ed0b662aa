//! The beam-search bookkeeping (`model::generate::beam`) against transformers' own `_beam_search`, with no
//! model and no GPU: `scripts/fixtures/make_beam_scripted.py` ran the reference's `generate(num_beams=...)` on a
//! scripted model (next-token logits a seeded random function of the sequence; vocabulary 12; decoder
//! start token 2 = EOS as in Florence-2) over a grid of 288 settings: 2/3/4 beams x early_stopping
//! true/false/"never" x length_penalty 1/0/2/-0.5 x no-repeat-n-gram 0/2 x forced BOS+EOS on/off x
//! (max_length 7, no EOS boost) / (max_length 10, EOS logit +1.5, so many hypotheses end naturally). It
//! recorded every log-prob row the reference computed, keyed by the sequence. Replaying those rows, the
//! bookkeeping must return the reference's ids in every scenario, and may only ask for rows the reference
//! computed too (it asks for fewer: a forced final token runs no step).
#![cfg(not(target_arch = "wasm32"))]

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::task::{Context, Poll, Waker};

use florence2_wasm::model::generate::beam::{self, BeamConfig, StepInputs, StepSource};
use florence2_wasm::model::generate::{EarlyStopping, Processors};
use florence2_wasm::Result;
use serde_json::Value;

struct Replay<'a> {
    rows: &'a HashMap<String, Vec<f32>>,
    seqs: Vec<Vec<u32>>,
    steps: usize,
}

impl StepSource for Replay<'_> {
    async fn step(&mut self, s: &StepInputs) -> Result<Vec<Vec<(u32, f32)>>> {
        let (src, tokens, pos, want) = (&s.src, &s.tokens, s.pos, &s.want);
        self.steps += 1;
        let mut seqs: Vec<Vec<u32>> = src.iter().map(|&s| self.seqs[s].clone()).collect();
        for (s, &t) in seqs.iter_mut().zip(tokens) {
            assert_eq!(s.len(), pos);
            s.push(t);
        }
        self.seqs = seqs;
        Ok(self
            .seqs
            .iter()
            .zip(want)
            .map(|(s, &w)| {
                let key = s.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                let row = self
                    .rows
                    .get(&key)
                    .unwrap_or_else(|| panic!("the reference never computed a row for {key}"));
                if w == 0 {
                    return Vec::new();
                }
                // The whole row, as the GPU source's full-row fallback gives it.
                row.iter()
                    .enumerate()
                    .map(|(i, &x)| (i as u32, x))
                    .collect()
            })
            .collect())
    }
}

fn block_on<T>(fut: impl Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("replay never waits"),
    }
}

#[test]
fn bookkeeping_matches_transformers_beam_search_on_scripted_logits() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/beam_scripted/reference.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let start = v["start"].as_u64().unwrap() as u32;
    let scenarios = v["scenarios"].as_array().unwrap();
    assert!(scenarios.len() >= 200);
    let mut natural = 0;
    let mut by_setting: HashMap<String, Vec<Vec<u32>>> = HashMap::new();
    for sc in scenarios {
        let kw = &sc["kwargs"];
        let rows: HashMap<String, Vec<f32>> = sc["rows"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, r)| {
                let row = r
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                (k.clone(), row)
            })
            .collect();
        let max_length = kw["max_length"].as_u64().unwrap() as usize;
        let id = |k: &str| kw[k].as_u64().map(|x| x as u32);
        let cfg = BeamConfig {
            num_beams: kw["num_beams"].as_u64().unwrap() as usize,
            length_penalty: kw["length_penalty"].as_f64().unwrap() as f32,
            early_stopping: match &kw["early_stopping"] {
                Value::Bool(true) => EarlyStopping::True,
                Value::Bool(false) => EarlyStopping::False,
                _ => EarlyStopping::Never,
            },
            max_length,
            eos_token_ids: vec![id("eos_token_id").unwrap()],
            decoder_start_token_id: start,
            processors: Processors {
                no_repeat_ngram_size: kw["no_repeat_ngram_size"].as_u64().unwrap() as usize,
                forced_bos_token_id: id("forced_bos_token_id"),
                forced_eos_token_id: id("forced_eos_token_id"),
                max_length,
            },
        };
        let nb = cfg.num_beams;
        let mut src = Replay {
            rows: &rows,
            seqs: vec![Vec::new(); nb],
            steps: 0,
        };
        let got = block_on(beam::run(cfg, &mut src, &|| false)).unwrap();
        let want: Vec<u32> = sc["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got, want, "scenario {}: {kw}", sc["salt"]);
        if want.len() < max_length {
            natural += 1;
        }
        // The three early_stopping values share one scripted model (salt).
        by_setting
            .entry(sc["salt"].as_str().unwrap().to_string())
            .or_default()
            .push(want);
    }
    let early_matters = by_setting
        .values()
        .filter(|answers| answers.iter().any(|a| a != &answers[0]))
        .count();
    eprintln!(
        "{} scenarios identical to transformers ({natural} end on a natural EOS; early_stopping \
         changes the answer in {early_matters} of {} settings)",
        scenarios.len(),
        by_setting.len()
    );
    assert!(natural > 50);
    assert!(early_matters > 5);
}
