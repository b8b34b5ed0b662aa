//! Huffman-coded entropy data: the bit reader (stuffed bytes, markers, zero padding past the data) and
//! the block decoders of sequential and progressive scans, as libjpeg's `jdhuff.c` and `jdphuff.c`
//! decode them, corrupt data included: a code longer than 16 bits decodes as 0, bits past the end of
//! the segment read as zeros, and once a scan has run out of data the MCUs after it stay zero until
//! the next restart marker.

use crate::error::{Error, Result};

/// `natural[k]`: the natural (row-major) index of the k-th coefficient in zigzag order, with libjpeg's
/// 16 extra entries of 63 that absorb a corrupt run past the end of a block.
pub(super) const NATURAL: [usize; 80] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
    63, 63, 63, 63, 63, 63,
];

/// Bits a table lookup resolves at once.
const LOOKAHEAD: u32 = 9;

/// A Huffman table (DHT): a lookup for codes of up to [`LOOKAHEAD`] bits, canonical code ranges for
/// the longer ones.
#[derive(Clone)]
pub(super) struct Huffman {
    /// By the next LOOKAHEAD bits: (code length, symbol); length 0 for a longer code.
    fast: Vec<(u8, u8)>,
    /// By code length l (1..=16): the largest code of that length (-1: none), and the index into
    /// `symbols` of its first code minus that first code.
    maxcode: [i32; 18],
    valoffset: [i32; 17],
    symbols: Vec<u8>,
}

impl Huffman {
    /// From a DHT's 16 code counts and its symbols.
    pub(super) fn new(counts: &[u8; 16], symbols: &[u8]) -> Result<Huffman> {
        let total: usize = counts.iter().map(|&c| usize::from(c)).sum();
        if total > 256 || total != symbols.len() {
            return Err(Error::Image("JPEG: bad Huffman table".into()));
        }
        let mut maxcode = [-1i32; 18];
        let mut valoffset = [0i32; 17];
        let mut fast = vec![(0u8, 0u8); 1 << LOOKAHEAD];
        let (mut code, mut k) = (0i32, 0usize);
        for l in 1..=16usize {
            let n = usize::from(counts[l - 1]);
            if n > 0 {
                valoffset[l] = k as i32 - code;
                for _ in 0..n {
                    if l as u32 <= LOOKAHEAD {
                        let shift = LOOKAHEAD - l as u32;
                        let base = (code as usize) << shift;
                        for e in fast.iter_mut().skip(base).take(1 << shift) {
                            *e = (l as u8, symbols[k]);
                        }
                    }
                    code += 1;
                    k += 1;
                }
                maxcode[l] = code - 1;
                if code > (1 << l) {
                    return Err(Error::Image("JPEG: bad Huffman table".into()));
                }
            }
            code <<= 1;
        }
        maxcode[17] = i32::MAX; // ends a corrupt code's search
        Ok(Huffman {
            fast,
            maxcode,
            valoffset,
            symbols: symbols.to_vec(),
        })
    }
}

/// The entropy-coded bits of one scan, starting at `pos` in the file.
pub(super) struct Bits<'a> {
    data: &'a [u8],
    pub(super) pos: usize,
    buf: u64,
    count: u32,
    /// A marker ends the data: `pos` is at its 0xFF.
    at_marker: bool,
    /// Bits past the data were read (as zeros) since the scan or the last restart began.
    pub(super) insufficient: bool,
}

impl<'a> Bits<'a> {
    pub(super) fn new(data: &'a [u8], pos: usize) -> Self {
        Bits {
            data,
            pos,
            buf: 0,
            count: 0,
            at_marker: false,
            insufficient: false,
        }
    }

    /// Fill the buffer to at least 57 bits or up to the next marker.
    fn fill(&mut self) {
        while self.count <= 56 && !self.at_marker {
            let Some(&b) = self.data.get(self.pos) else {
                self.at_marker = true;
                return;
            };
            if b == 0xFF {
                let mut i = self.pos + 1;
                while self.data.get(i) == Some(&0xFF) {
                    i += 1;
                }
                if self.data.get(i) == Some(&0x00) {
                    self.pos = i + 1;
                } else {
                    self.at_marker = true;
                    return;
                }
            } else {
                self.pos += 1;
            }
            self.buf |= u64::from(b) << (56 - self.count);
            self.count += 8;
        }
    }

    /// Make `n` (<= 32) bits available, padding with zeros past the data.
    fn need(&mut self, n: u32) {
        if self.count < n {
            self.fill();
            if self.count < n {
                self.insufficient = true;
                self.count = 64; // zeros
            }
        }
    }

    pub(super) fn get(&mut self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        self.need(n);
        let v = (self.buf >> (64 - n)) as u32;
        self.buf <<= n;
        self.count -= n;
        v
    }

    pub(super) fn bit(&mut self) -> bool {
        self.get(1) == 1
    }

    /// One Huffman symbol (0 for a code that is not in the table).
    pub(super) fn decode(&mut self, h: &Huffman) -> u8 {
        if self.count < LOOKAHEAD {
            self.fill();
        }
        if self.count >= LOOKAHEAD {
            let (len, sym) = h.fast[(self.buf >> (64 - LOOKAHEAD)) as usize];
            if len > 0 {
                self.buf <<= len;
                self.count -= u32::from(len);
                return sym;
            }
        }
        // Bit by bit (past the data only as far as the code needs).
        let mut code = self.get(1) as i32;
        let mut l = 1usize;
        while l <= 16 && code > h.maxcode[l] {
            code = (code << 1) | self.get(1) as i32;
            l += 1;
        }
        if l > 16 {
            return 0; // libjpeg: "Corrupt JPEG data: bad Huffman code", symbol 0
        }
        let idx = (code + h.valoffset[l]) as usize;
        h.symbols.get(idx).copied().unwrap_or(0)
    }

    /// `s` bits as a signed coefficient (JPEG's EXTEND).
    pub(super) fn receive_extend(&mut self, s: u8) -> i32 {
        if s == 0 {
            return 0;
        }
        let s = u32::from(s.min(16));
        let v = self.get(s) as i32;
        if v < (1 << (s - 1)) {
            v - (1 << s) + 1
        } else {
            v
        }
    }

    /// Skip to the restart marker after the bits read so far (discarding the partial byte); the position
    /// ends after it, or at the next other marker when the scan ended early.
    pub(super) fn restart(&mut self) {
        self.buf = 0;
        self.count = 0;
        self.insufficient = false;
        // The marker, or the bytes before it (the scan ended early: resynchronise on the next marker).
        let mut i = self.pos;
        loop {
            let Some(&b) = self.data.get(i) else {
                self.pos = i;
                self.at_marker = true;
                return;
            };
            if b != 0xFF {
                i += 1;
                continue;
            }
            match self.data.get(i + 1) {
                Some(0xD0..=0xD7) => {
                    self.pos = i + 2;
                    self.at_marker = false;
                    return;
                }
                Some(0x00 | 0xFF) => i += 1,
                _ => {
                    self.pos = i;
                    self.at_marker = true;
                    return;
                }
            }
        }
    }

    /// The position of the marker that ends the scan's data.
    pub(super) fn end(&self) -> usize {
        let mut i = self.pos;
        loop {
            match (self.data.get(i), self.data.get(i + 1)) {
                (Some(0xFF), Some(0x00 | 0xFF | 0xD0..=0xD7)) => i += 1,
                (Some(0xFF), Some(_)) => return i,
                (Some(_), _) => i += 1,
                (None, _) => return self.data.len(),
            }
        }
    }
}

/// One block of a sequential scan: DC difference and AC run-lengths, coefficients in natural order.
pub(super) fn sequential_block(
    bits: &mut Bits,
    dc: &Huffman,
    ac: &Huffman,
    pred: &mut i32,
    block: &mut [i16; 64],
) {
    let s = bits.decode(dc);
    let diff = bits.receive_extend(s);
    *pred = pred.wrapping_add(diff);
    block[0] = *pred as i16;
    let mut k = 1usize;
    while k < 64 {
        let rs = bits.decode(ac);
        let (r, s) = (usize::from(rs >> 4), rs & 15);
        if s != 0 {
            k += r;
            block[NATURAL[k]] = bits.receive_extend(s) as i16;
            k += 1;
        } else {
            if r != 15 {
                break;
            }
            k += 16;
        }
    }
}

/// A progressive DC scan's bits for one block: the first (`refine` false) or a refinement.
pub(super) fn dc_progressive(
    bits: &mut Bits,
    dc: Option<&Huffman>,
    al: u32,
    pred: &mut i32,
    block: &mut [i16; 64],
) {
    match dc {
        Some(h) => {
            let s = bits.decode(h);
            *pred = pred.wrapping_add(bits.receive_extend(s));
            block[0] = pred.wrapping_shl(al) as i16;
        }
        None => {
            if bits.bit() {
                block[0] |= (1i32 << al) as i16;
            }
        }
    }
}

/// The spectral band and successive-approximation bit of a progressive AC scan.
#[derive(Clone, Copy)]
pub(super) struct Band {
    pub ss: usize,
    pub se: usize,
    pub al: u32,
}

/// A progressive AC scan's first pass over one block (`eobrun`: blocks left in an end-of-band run).
pub(super) fn ac_first(
    bits: &mut Bits,
    h: &Huffman,
    b: Band,
    eobrun: &mut u32,
    block: &mut [i16; 64],
) {
    if *eobrun > 0 {
        *eobrun -= 1;
        return;
    }
    let mut k = b.ss;
    while k <= b.se {
        let rs = bits.decode(h);
        let (r, s) = (u32::from(rs >> 4), rs & 15);
        if s != 0 {
            k += r as usize;
            let v = bits.receive_extend(s);
            block[NATURAL[k]] = v.wrapping_shl(b.al) as i16;
        } else if r == 15 {
            k += 15;
        } else {
            *eobrun = (1 << r) + bits.get(r) - 1;
            break;
        }
        k += 1;
    }
}

/// A progressive AC scan's refinement of one block.
pub(super) fn ac_refine(
    bits: &mut Bits,
    h: &Huffman,
    b: Band,
    eobrun: &mut u32,
    block: &mut [i16; 64],
) {
    let p1 = 1i32 << b.al;
    let m1 = -1i32 << b.al;
    let correct = |bits: &mut Bits, c: &mut i16| {
        if bits.bit() && (i32::from(*c) & p1) == 0 {
            *c = (i32::from(*c) + if *c >= 0 { p1 } else { m1 }) as i16;
        }
    };
    let mut k = b.ss;
    if *eobrun == 0 {
        while k <= b.se {
            let rs = bits.decode(h);
            let (mut r, s) = (i32::from(rs >> 4), rs & 15);
            let mut value = 0i32;
            if s != 0 {
                value = if bits.bit() { p1 } else { m1 };
            } else if r != 15 {
                *eobrun = (1 << r) + bits.get(r as u32);
                break;
            }
            // Past the nonzero coefficients (refining them) and r zero ones.
            while k <= b.se {
                let c = &mut block[NATURAL[k]];
                if *c != 0 {
                    correct(bits, c);
                } else {
                    r -= 1;
                    if r < 0 {
                        break;
                    }
                }
                k += 1;
            }
            if value != 0 {
                block[NATURAL[k]] = value as i16;
            }
            k += 1;
        }
    }
    if *eobrun > 0 {
        while k <= b.se {
            let c = &mut block[NATURAL[k]];
            if *c != 0 {
                correct(bits, c);
            }
            k += 1;
        }
        *eobrun -= 1;
    }
}
