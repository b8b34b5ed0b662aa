//! Peak host memory of the streaming loader, measured with a counting global allocator (this binary
//! holds one test, so nothing else allocates meanwhile): streaming a 16 MiB checkpoint in 256 KiB
//! chunks (push-style streaming, and the ranged loader) must grow the Rust heap by a small multiple of
//! the chunk, not by the file; so must converting it (`florence2 convert`'s exporter) into every dtype.
#![cfg(not(target_arch = "wasm32"))]

mod weights_util;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use florence2_wasm::config::Florence2Config;
use florence2_wasm::weights::export::{ExportOptions, Exporter};
use florence2_wasm::weights::load::load_checkpoint;
use florence2_wasm::weights::{Assembler, LoadOptions, StreamLoader, WeightDType};
use weights_util::*;

// ---- allocation counter (this test binary only) ----------------------------------------------------
struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let c = CURRENT.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(c, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        CURRENT.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn peak_host_memory_is_about_one_chunk() {
    // A checkpoint dominated by a 2^16 x 64 f32 embedding (16 MiB), streamed in 256 KiB chunks.
    let mut cfg_json = tiny_config_json();
    cfg_json["text_config"]["vocab_size"] = serde_json::json!(1 << 16);
    cfg_json["text_config"]["d_model"] = serde_json::json!(64);
    cfg_json["projection_dim"] = serde_json::json!(64);
    cfg_json["vision_config"]["projection_dim"] = serde_json::json!(64);
    let cfg = Florence2Config::from_json(&cfg_json).unwrap();
    let canon = canonical_tensors(&cfg, 13);
    let file = write_safetensors(&variant_tensors(&canon, Variant::HfNative, Dt::F32), None);
    drop(canon);
    let chunk = 256 << 10;
    let gpu = gpu();
    // Warm up the device / pipeline paths outside the measured window.
    drop(stream(&cfg, &file, &[chunk], true).unwrap());
    gpu.wait_idle().unwrap();

    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let w = stream(&cfg, &file, &[chunk], true).unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - base;
    eprintln!(
        "file {} bytes, chunk {chunk}: peak Rust heap growth while streaming {peak} bytes \
         ({:.1}% of the file); GPU bytes {}",
        file.len(),
        100.0 * peak as f64 / file.len() as f64,
        w.byte_size()
    );
    // The loader's own buffers, per resident dtype: the caller's chunk + its f32 conversion + the
    // encoded copy written to the GPU (f16: half the conversion; q8/q4 less) + one pending row
    // (+ the small header).
    for dtype in WeightDType::ALL {
        let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::with_dtype(dtype));
        let mut s = StreamLoader::new("model.safetensors", Some(file.len() as u64));
        for c in file.chunks(chunk) {
            s.feed(&mut asm, c).unwrap();
        }
        s.finish(&mut asm).unwrap();
        let own = asm.mem_stats().peak;
        drop(asm.finish().unwrap());
        eprintln!("{dtype}: loader's own accounting {own} bytes");
        let encoded = if dtype == WeightDType::Fp32 {
            0
        } else {
            chunk as u64 / 2
        };
        assert!(
            own <= 2 * chunk as u64 + encoded + 64 * 1024,
            "{dtype}: own accounting {own}"
        );
    }
    // Whole-process Rust heap (loader + wgpu bookkeeping) stays a small multiple of the chunk, far
    // below the 16 MiB file.
    assert!(peak < 8 * chunk, "peak {peak}");

    // The ranged loader (what `load_dir` runs) on the same file with the same chunk size: it reads one
    // chunk-sized range at a time.
    let files = mem_model(&cfg_json, &[("model.safetensors", file.clone())]);
    let opts = LoadOptions {
        chunk_bytes: chunk,
        ..LoadOptions::default()
    };
    drop(w);
    gpu.wait_idle().unwrap();
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let (_, w) =
        pollster::block_on(florence2_wasm::weights::load_files(&gpu, &files, opts)).unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - base;
    eprintln!(
        "ranged loader, chunk {chunk}: peak Rust heap growth {peak} bytes ({:.1}% of the file)",
        100.0 * peak as f64 / file.len() as f64
    );
    assert!(w.byte_size() > file.len() as u64 / 2);
    assert!(peak < 8 * chunk, "ranged peak {peak}");
    drop(w);

    // A quantized checkpoint of the same tensors (q8 `.qweight` rows for the matrices with 32-weight
    // rows, the 2^16 x 64 embedding among them: 5 MiB of rows) streamed into every resident dtype: as q8
    // the rows are copied, otherwise dequantized in bounded batches (at most 256 KiB of f32 at once),
    // so the heap again grows by a small multiple of the chunk, even as fp32 (4.7x the file's bytes).
    let canon = canonical_tensors(&cfg, 13);
    let mut tensors = Vec::new();
    let mut listed = Vec::new();
    for (name, shape, values) in &canon {
        let k = shape.last().copied().unwrap_or(0);
        if florence2_wasm::weights::is_matrix_weight(name, shape) && k % 32 == 0 {
            let mut rows = Vec::new();
            florence2_wasm::quant::quantize_rows(
                florence2_wasm::quant::QFormat::Q8,
                k,
                values,
                &mut rows,
            )
            .unwrap();
            tensors.push(RawTensor {
                name: format!("{name}.qweight"),
                dtype: "U8".into(),
                shape: vec![shape[0], rows.len() / shape[0]],
                bytes: rows,
            });
            listed.push(name.clone());
        } else {
            tensors.push(RawTensor::new(name, Dt::F32, shape, values));
        }
    }
    drop(canon);
    let qfile = write_safetensors(&tensors, None);
    drop(tensors);
    let mut qcfg_json = cfg_json.clone();
    qcfg_json["quantization"] = serde_json::json!({"format": "florence2-wasm-block", "bits": 8,
        "block_size": 32, "scale_dtype": "float16", "tensors": listed});
    let qcfg = Florence2Config::from_json(&qcfg_json).unwrap();
    for dtype in WeightDType::ALL {
        gpu.wait_idle().unwrap();
        let base = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let mut asm = Assembler::new(&gpu, &qcfg, LoadOptions::with_dtype(dtype));
        let mut s = StreamLoader::new("model.safetensors", Some(qfile.len() as u64));
        for c in qfile.chunks(chunk) {
            s.feed(&mut asm, c).unwrap();
        }
        s.finish(&mut asm).unwrap();
        let own = asm.mem_stats().peak;
        let w = asm.finish().unwrap();
        let peak = PEAK.load(Ordering::Relaxed) - base;
        eprintln!(
            "q8 file ({} bytes) as {dtype}: peak Rust heap growth {peak} bytes, loader's own {own}; GPU bytes {}",
            qfile.len(),
            w.byte_size()
        );
        assert!(
            own <= 2 * chunk as u64 + (256 << 10) + 64 * 1024,
            "{dtype}: own accounting {own}"
        );
        assert!(peak < 8 * chunk, "q8 file as {dtype}: peak {peak}");
        drop(w);
    }

    // The converter (`florence2 convert`, the weights part) on the f32 file, into every dtype, in 4 MiB
    // shards: one chunk read, converted and written at a time, shards assembled chunk by chunk.
    let dir = std::env::temp_dir().join(format!("f2w-convert-mem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), &file).unwrap();
    let src = florence2_wasm::weights::DirFiles::new(&dir);
    for dtype in WeightDType::ALL {
        let out = dir.join(format!("out-{dtype}"));
        std::fs::create_dir_all(&out).unwrap();
        let mut opts = ExportOptions::new(dtype);
        opts.chunk_bytes = chunk;
        opts.shard_size = Some(4 << 20);
        let base = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let mut ex = Exporter::new(&cfg, &out, &opts).unwrap();
        pollster::block_on(load_checkpoint(&src, &mut ex)).unwrap();
        let done = ex.finish().unwrap();
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let written: u64 = done
            .files
            .iter()
            .flat_map(|f| &f.tensors)
            .map(|t| t.2)
            .sum();
        eprintln!(
            "convert to {dtype}: {} files, {written} bytes of tensors; peak Rust heap growth {peak} bytes",
            done.files.len()
        );
        assert_eq!(done.files.len() > 1, written > 4 << 20, "{dtype}: sharded");
        assert!(written > (file.len() / 8) as u64, "{dtype}");
        assert!(peak < 8 * chunk, "convert to {dtype}: peak {peak}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
