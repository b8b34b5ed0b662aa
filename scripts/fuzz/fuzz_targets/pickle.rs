//! The PyTorch checkpoint reader (restricted pickle VM, zip and legacy containers) on arbitrary bytes:
//! the first input byte chooses a chunk size, the rest is a file read both whole and in those chunks.
//! Invariants: no panic or hang; both readings agree on success or failure (and the error's kind);
//! every storage's bytes arrive in order and whole, tensors lie inside their storages; the pickle VM on
//! the raw input never panics either. Allocation bound: 256 n + 16 MiB (the VM's work budget is linear
//! in the input; values are shared, never deep-copied, on memo reads).
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::error::Result;
use florence2_wasm::weights::pickle::read_pickle;
use florence2_wasm::weights::{StateDict, StorageSink, TorchReader};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

#[derive(Default)]
struct Check {
    sd: Option<StateDict>,
    got: Vec<u64>,
}

impl StorageSink for Check {
    fn state_dict(&mut self, sd: &StateDict) -> Result<()> {
        assert!(self.sd.is_none(), "a second state dict");
        for t in &sd.tensors {
            let s = &sd.storages[t.storage];
            let (a, b) = t.byte_range();
            assert!(a <= b && b <= s.byte_len(), "{} outside its storage", t.name);
            assert_eq!(t.dtype, s.dtype);
        }
        self.got = vec![0; sd.storages.len()];
        self.sd = Some(sd.clone());
        Ok(())
    }
    fn storage_bytes(&mut self, index: usize, offset: u64, bytes: &[u8]) -> Result<()> {
        let sd = self.sd.as_ref().expect("bytes before the state dict");
        assert_eq!(self.got[index], offset, "out of order");
        self.got[index] += bytes.len() as u64;
        assert!(self.got[index] <= sd.storages[index].byte_len());
        Ok(())
    }
}

fn read(file: &[u8], chunk: usize) -> std::result::Result<Check, &'static str> {
    let mut r = TorchReader::new("fuzz.bin");
    let mut c = Check::default();
    for piece in file.chunks(chunk) {
        r.feed(&mut c, piece).map_err(|e| e.name())?;
    }
    r.finish(&mut c).map_err(|e| e.name())?;
    let sd = c.sd.as_ref().expect("finished without a state dict");
    for (i, s) in sd.storages.iter().enumerate() {
        assert_eq!(c.got[i], s.byte_len(), "storage {} incomplete", s.key);
    }
    Ok(c)
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, file)) = data.split_first() else {
        return;
    };
    let (_, peak) = common::peak_during(|| {
        let _ = read_pickle(file, "fuzz.pkl");
        let whole = read(file, file.len().max(1));
        let chunked = read(file, 1 + usize::from(head) % 64);
        match (&whole, &chunked) {
            (Ok(a), Ok(b)) => assert_eq!(
                a.sd.as_ref().map(|s| s.tensors.clone()),
                b.sd.as_ref().map(|s| s.tensors.clone())
            ),
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("whole {:?} vs chunked {:?}", whole.is_ok(), chunked.is_ok()),
        }
    });
    common::check_bound("pickle", data.len(), peak, 256, 16 << 20);
});
