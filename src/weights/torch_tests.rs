//! Unit tests of the PyTorch checkpoint reader on hand-built files: the pickle opcodes torch writes, zip
//! and legacy containers fed whole and in chunks of every size, shared storages and offsets, and every
//! refusal (foreign globals, refused opcodes, strides, truncation, bounds) as a named error.

use crate::error::Error;
use crate::weights::header::StDtype;
use crate::weights::pickle::{read_pickle, Parsed};
use crate::weights::torch::StateDict;
use crate::weights::torch_reader::{StorageSink, TorchReader};

/// A pickle writer emitting the opcodes torch.save does (protocol 2).
struct P(Vec<u8>);

impl P {
    fn new() -> P {
        P(vec![0x80, 2])
    }
    fn op(&mut self, b: &[u8]) -> &mut P {
        self.0.extend_from_slice(b);
        self
    }
    fn global(&mut self, module: &str, name: &str) -> &mut P {
        self.op(format!("c{module}\n{name}\n").as_bytes())
    }
    fn str(&mut self, s: &str) -> &mut P {
        self.op(b"X")
            .op(&(s.len() as u32).to_le_bytes())
            .op(s.as_bytes())
    }
    fn int(&mut self, i: u32) -> &mut P {
        self.op(b"J").op(&i.to_le_bytes())
    }
    fn ints(&mut self, v: &[u32]) -> &mut P {
        self.op(b"(");
        for &i in v {
            self.int(i);
        }
        self.op(b"t")
    }
    /// `_rebuild_tensor_v2(pid, offset, size, stride, False, OrderedDict())`.
    fn tensor(&mut self, key: &str, class: &str, numel: u32, offset: u32, shape: &[u32]) -> &mut P {
        let mut stride = vec![0; shape.len()];
        let mut s = 1;
        for i in (0..shape.len()).rev() {
            stride[i] = s;
            s *= shape[i];
        }
        self.tensor_strided(key, class, numel, offset, shape, &stride)
    }
    fn tensor_strided(
        &mut self,
        key: &str,
        class: &str,
        numel: u32,
        offset: u32,
        shape: &[u32],
        stride: &[u32],
    ) -> &mut P {
        self.global("torch._utils", "_rebuild_tensor_v2").op(b"(");
        self.op(b"(")
            .str("storage")
            .global("torch", class)
            .str(key)
            .str("cpu")
            .int(numel);
        self.op(b"tQ")
            .int(offset)
            .ints(shape)
            .ints(stride)
            .op(b"\x89");
        self.global("collections", "OrderedDict")
            .op(b")R")
            .op(b"tR")
    }
    /// `OrderedDict()` memoized as 0, then MARK: entries follow, closed by [`P::end_dict`].
    fn begin_dict(&mut self) -> &mut P {
        self.global("collections", "OrderedDict").op(b")Rq\x00(")
    }
    fn end_dict(&mut self) -> Vec<u8> {
        self.op(b"u.");
        std::mem::take(&mut self.0)
    }
}

/// A state dict: `a` (2, 3) f32 at storage 0, `b` (3,) f32 at element 3 of storage 0 (shared), `c` (2,)
/// f16 in storage 1; `d` is the same tensor object as `a` (memo get).
fn sample_pickle() -> Vec<u8> {
    let mut p = P::new();
    p.begin_dict();
    p.str("a")
        .tensor("0", "FloatStorage", 6, 0, &[2, 3])
        .op(b"q\x01");
    p.str("b").tensor("0", "FloatStorage", 6, 3, &[3]);
    p.str("c").tensor("1", "HalfStorage", 2, 0, &[2]);
    p.str("d").op(b"h\x01");
    p.str("n").int(7); // a non-tensor entry: skipped
    p.end_dict()
}

fn storage0() -> Vec<u8> {
    (0..24u8).collect()
}

fn storage1() -> Vec<u8> {
    vec![0xa0, 0xa1, 0xa2, 0xa3]
}

fn local(name: &str, data: &[u8], pad: usize) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend(0x0403_4b50u32.to_le_bytes());
    h.extend([20, 0, 0, 0, 0, 0]);
    h.extend([0u8; 8]);
    h.extend((data.len() as u32).to_le_bytes());
    h.extend((data.len() as u32).to_le_bytes());
    h.extend((name.len() as u16).to_le_bytes());
    h.extend((pad as u16 + 4).to_le_bytes());
    h.extend(name.as_bytes());
    h.extend([0x46, 0x42]);
    h.extend((pad as u16).to_le_bytes());
    h.extend(vec![b'Z'; pad]);
    h.extend(data);
    h
}

/// A local header with its sizes deferred (flag bit 3, as torch 2.x writes), the data, its descriptor.
fn deferred(name: &str, data: &[u8], pad: usize) -> Vec<u8> {
    let mut h = local(name, data, pad);
    h[6] = 8;
    h[7] = 8;
    h[18..26].fill(0);
    h.extend(0x0807_4b50u32.to_le_bytes());
    h.extend([0xcc; 4]);
    h.extend((data.len() as u32).to_le_bytes());
    h.extend((data.len() as u32).to_le_bytes());
    h
}

/// A zip checkpoint as torch 2.x writes it: every entry's sizes in a descriptor, small records.
fn sample_zip_v2() -> Vec<u8> {
    let mut z = Vec::new();
    z.extend(deferred("m/data.pkl", &sample_pickle(), 7));
    z.extend(deferred("m/.format_version", b"1", 30));
    z.extend(deferred("m/.storage_alignment", b"64", 2));
    z.extend(deferred("m/byteorder", b"little", 3));
    z.extend(deferred("m/data/0", &storage0(), 20));
    z.extend(deferred("m/data/1", &storage1(), 0));
    z.extend(deferred("m/version", b"3\n", 1));
    z.extend(deferred("m/.data/serialization_id", b"0123456789", 1));
    z.extend(0x0201_4b50u32.to_le_bytes());
    z.extend(b"central directory bytes");
    z
}

/// A zip checkpoint as torch 1.x writes it (sizes in the local headers; the central directory
/// abbreviated to its signature + junk).
fn sample_zip() -> Vec<u8> {
    let mut z = Vec::new();
    z.extend(local("archive/data.pkl", &sample_pickle(), 7));
    z.extend(local("archive/byteorder", b"little", 3));
    z.extend(local("archive/data/0", &storage0(), 20));
    z.extend(local("archive/data/1", &storage1(), 0));
    z.extend(local("archive/version", b"3\n", 1));
    z.extend(0x0201_4b50u32.to_le_bytes());
    z.extend(b"central directory bytes");
    z
}

/// A legacy checkpoint: five pickles, then per storage key a u64 count and the bytes.
fn sample_legacy() -> Vec<u8> {
    let mut f = Vec::new();
    // 0x1950a86a20f9469cfc6c as LONG1 of 10 bytes.
    f.extend([
        0x80, 2, 0x8a, 10, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, b'.',
    ]);
    f.extend(P::new().op(b"M\xe9\x03.").0.clone());
    let mut info = P::new();
    info.op(b"}(")
        .str("protocol_version")
        .op(b"M\xe9\x03")
        .str("little_endian")
        .op(b"\x88u.");
    f.extend(info.0.clone());
    f.extend(sample_pickle());
    let mut keys = P::new();
    keys.op(b"](").str("0").str("1").op(b"e.");
    f.extend(keys.0.clone());
    f.extend(6u64.to_le_bytes());
    f.extend(storage0());
    f.extend(2u64.to_le_bytes());
    f.extend(storage1());
    f
}

/// Collects the state dict and every storage's bytes.
#[derive(Default, Debug)]
struct Collect {
    sd: Option<StateDict>,
    storages: Vec<Vec<u8>>,
}

impl StorageSink for Collect {
    fn state_dict(&mut self, sd: &StateDict) -> crate::error::Result<()> {
        assert!(self.sd.is_none());
        self.storages = vec![Vec::new(); sd.storages.len()];
        self.sd = Some(sd.clone());
        Ok(())
    }
    fn storage_bytes(
        &mut self,
        index: usize,
        offset: u64,
        bytes: &[u8],
    ) -> crate::error::Result<()> {
        assert_eq!(self.storages[index].len() as u64, offset);
        self.storages[index].extend_from_slice(bytes);
        Ok(())
    }
}

fn read_chunked(file: &[u8], chunk: usize) -> crate::error::Result<Collect> {
    let mut r = TorchReader::new("t.bin");
    let mut c = Collect::default();
    for piece in file.chunks(chunk.max(1)) {
        r.feed(&mut c, piece)?;
    }
    r.finish(&mut c)?;
    Ok(c)
}

fn check_sample(c: &Collect) {
    let sd = c.sd.as_ref().expect("state dict");
    let names: Vec<&str> = sd.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    let t = |n: &str| sd.tensors.iter().find(|t| t.name == n).unwrap();
    assert_eq!(
        (t("a").shape.clone(), t("a").offset, t("a").dtype),
        (vec![2, 3], 0, StDtype::F32)
    );
    assert_eq!(
        (t("b").byte_range(), t("b").storage),
        ((12, 24), t("a").storage)
    );
    assert_eq!((t("c").dtype, t("c").byte_range()), (StDtype::F16, (0, 4)));
    assert_eq!(
        t("d"),
        &crate::weights::TorchTensor {
            name: "d".into(),
            ..t("a").clone()
        }
    );
    assert_eq!(sd.storages.len(), 2);
    assert_eq!(c.storages[t("a").storage], storage0());
    assert_eq!(c.storages[t("c").storage], storage1());
}

/// `file` reads to the sample state dict whole and fed in chunks of every size.
fn reads_in_every_chunk_size(file: &[u8]) {
    for chunk in 1..=file.len() {
        check_sample(&read_chunked(file, chunk).unwrap_or_else(|e| panic!("chunk {chunk}: {e}")));
    }
}

#[test]
fn zip_checkpoint_reads_whole_and_in_every_chunk_size() {
    reads_in_every_chunk_size(&sample_zip());
}

#[test]
fn zip_with_descriptors_reads_whole_and_in_every_chunk_size() {
    reads_in_every_chunk_size(&sample_zip_v2());
}

#[test]
fn legacy_checkpoint_reads_whole_and_in_every_chunk_size() {
    reads_in_every_chunk_size(&sample_legacy());
}

/// Every strict prefix of a valid file is an error with a name, never a panic or a success.
#[test]
fn truncated_files_are_named_errors() {
    for file in [sample_zip(), sample_legacy()] {
        let end = if file.starts_with(b"PK") {
            file.len() - 27
        } else {
            file.len()
        };
        for n in 0..end {
            let e = read_chunked(&file[..n], 5)
                .err()
                .unwrap_or_else(|| panic!("prefix {n} loaded"));
            assert_eq!(e.name(), "Florence2LoadError");
        }
    }
}

/// Flipping any byte never panics (errors or a different, still valid, reading).
#[test]
fn garbled_files_never_panic() {
    for file in [sample_zip(), sample_zip_v2(), sample_legacy()] {
        for i in 0..file.len() {
            for x in [0x01, 0x80, 0xff] {
                let mut g = file.clone();
                g[i] ^= x;
                let _ = read_chunked(&g, 7);
            }
        }
    }
}

fn pickle_err(bytes: &[u8]) -> Error {
    match read_pickle(bytes, "t.pkl") {
        Err(e) => e,
        Ok(p) => panic!("accepted: {p:?}"),
    }
}

#[test]
fn foreign_globals_are_refused_by_name() {
    // GLOBAL os.system, STACK_GLOBAL builtins.eval, and a `__reduce__` of posix.system ("echo"):
    // refused where the global is named, before any REDUCE.
    let mut reduce = P::new();
    reduce
        .global("posix", "system")
        .str("echo pwned")
        .op(b"\x85R.");
    let mut stack = P::new();
    stack
        .str("builtins")
        .str("eval")
        .op(b"\x93")
        .str("1+1")
        .op(b"\x85R.");
    let mut in_dict = P::new();
    in_dict
        .begin_dict()
        .str("w")
        .global("torch", "load")
        .op(b")R");
    let cases = [
        (
            P::new().global("os", "system").op(b".").0.clone(),
            "os.system",
        ),
        (stack.0.clone(), "builtins.eval"),
        (reduce.0.clone(), "posix.system"),
        (in_dict.end_dict(), "torch.load"),
        (
            P::new().global("torch", "Tensor").op(b".").0.clone(),
            "torch.Tensor",
        ),
        (
            P::new()
                .global("torch._utils", "_rebuild_tensor")
                .op(b".")
                .0
                .clone(),
            "torch._utils._rebuild_tensor",
        ),
    ];
    for (bytes, name) in cases {
        match pickle_err(&bytes) {
            Error::PickleGlobal { name: n, .. } => assert_eq!(n, name),
            e => panic!("{name}: {e}"),
        }
    }
}

#[test]
fn instantiating_opcodes_are_refused_by_name() {
    let cases: [(&[u8], &str); 5] = [
        (b"\x80\x02(ios\nsystem\n.", "INST"),
        (b"\x80\x02(o.", "OBJ"),
        (b"\x80\x02))\x81.", "NEWOBJ"),
        (b"\x80\x02\x82\x01.", "EXT"),
        (b"\x80\x05\x97.", "out-of-band"),
    ];
    for (bytes, what) in cases {
        match pickle_err(bytes) {
            Error::PickleRefused { what: w, .. } => assert!(w.contains(what), "{w}"),
            e => panic!("{what}: {e}"),
        }
    }
}

#[test]
fn malformed_pickles_are_named_errors() {
    let cases: [&[u8]; 9] = [
        b"\x80\x02.",                                  // STOP on an empty stack
        b"\x80\x02\xff.",                              // unknown opcode
        b"\x80\x02h\x05.",                             // memo entry never stored
        b"\x80\x02Ja\x00\x00\x00a.",                   // APPEND to an int
        b"\x80\x02ccollections\nOrderedDict\nK\x01R.", // REDUCE args not a tuple
        b"\x80\x02ctorch\nFloatStorage\n)R.",          // calling a storage class
        b"\x80\x02X\xff\xff\xff\x7f",                  // 2 GiB string
        b"\x80\x02K\x01b.",                            // BUILD on an int
        b"\x80\x02u.",                                 // SETITEMS without a mark
    ];
    for bytes in cases {
        let e = pickle_err(bytes);
        assert!(matches!(e, Error::Pickle { .. }), "{bytes:?}: {e}");
    }
    assert!(matches!(
        read_pickle(b"\x80\x02]", "t"),
        Ok(Parsed::NeedMore)
    ));
}

#[test]
fn nesting_stack_and_work_are_bounded() {
    let mut deep = vec![0x80, 2];
    deep.extend(std::iter::repeat_n(b']', 200));
    deep.extend(std::iter::repeat_n(b'a', 199));
    deep.push(b'.');
    assert!(pickle_err(&deep).to_string().contains("nested"));
    // A list of 1000 items read back through the memo and mutated 3000 times: copies spend the budget.
    let mut copy = vec![0x80, 2, b']', b'q', 0, b'('];
    copy.extend(std::iter::repeat_n(b'N', 1000));
    copy.extend(b"eq\x00");
    for _ in 0..3000 {
        copy.extend(b"0h\x00Na");
    }
    copy.push(b'.');
    assert!(pickle_err(&copy).to_string().contains("budget"));
}

fn sd_err(pickle: Vec<u8>) -> Error {
    let mut z = Vec::new();
    z.extend(local("archive/data.pkl", &pickle, 0));
    read_chunked(&z, 64).expect_err("refused")
}

#[test]
fn strides_offsets_and_storages_are_checked() {
    let mut p = P::new();
    p.begin_dict()
        .str("t")
        .tensor_strided("0", "FloatStorage", 6, 0, &[2, 3], &[1, 2]);
    assert!(sd_err(p.end_dict()).to_string().contains("not contiguous"));
    let mut p = P::new();
    p.begin_dict()
        .str("t")
        .tensor("0", "FloatStorage", 6, 1, &[2, 3]);
    assert!(sd_err(p.end_dict()).to_string().contains("outside storage"));
    let mut p = P::new();
    p.begin_dict()
        .str("t")
        .tensor("0", "FloatStorage", 6, 0, &[6]);
    p.str("u").tensor("0", "HalfStorage", 6, 0, &[6]);
    assert!(sd_err(p.end_dict()).to_string().contains("declared twice"));
    // A size-1 dimension may have any stride.
    let mut p = P::new();
    p.begin_dict()
        .str("t")
        .tensor_strided("0", "FloatStorage", 3, 0, &[1, 3], &[9, 1]);
    let e = sd_err(p.end_dict());
    assert!(e.to_string().contains("ends before"), "{e}");
}

#[test]
fn containers_are_checked() {
    let mut z = sample_zip();
    // Storage 0's data entry announces the wrong size: rename it so data/1 comes first with 24 bytes.
    let at = z.windows(14).position(|w| w == b"archive/data/0").unwrap();
    z[at + 13] = b'1';
    assert!(read_chunked(&z, 9)
        .unwrap_err()
        .to_string()
        .contains("holds 24 bytes"));
    let mut z = sample_zip_v2();
    let at = z.windows(8).position(|w| w == b"m/data/1").unwrap();
    let d = at + 8 + 4 + 4; // the name, its padding field, then storage1's 4 bytes
    z[d + 8] = 5; // the descriptor's compressed size
    let e = read_chunked(&z, 9).unwrap_err().to_string();
    assert!(e.contains("descriptor"), "{e}");
    let mut z = sample_zip();
    let at = z.windows(6).position(|w| w == b"little").unwrap();
    z[at..at + 6].copy_from_slice(b"big\0\0\0");
    assert!(read_chunked(&z, 9)
        .unwrap_err()
        .to_string()
        .contains("byte order"));
    let mut l = sample_legacy();
    let n = l.len();
    l[n - 12] = 3; // storage 1's count
    assert!(read_chunked(&l, 9)
        .unwrap_err()
        .to_string()
        .contains("elements"));
    l = sample_legacy();
    l.push(0);
    assert!(read_chunked(&l, 9)
        .unwrap_err()
        .to_string()
        .contains("after the last storage"));
    assert!(read_chunked(b"{\"json\": 1}", 9).is_err());
}
