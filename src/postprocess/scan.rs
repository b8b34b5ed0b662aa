//! Linear-time scanners that reproduce the exact semantics of the reference post-processor's Python regular
//! expressions (`re` module, str patterns, no flags) on the pieces Florence-2 generations are made of.
//!
//! Python details that matter and are reproduced here:
//! - `\s` and `str.strip()` use `str.isspace()`: Unicode White_Space plus U+001C..U+001F ([`py_isspace`]).
//! - `\d` matches any Unicode decimal digit (category Nd), and `int()` accepts them: `<loc_١٢>` is bin 12
//!   ([`decimal_value`]).
//! - `.` matches anything except `\n`.
//! - `int()` refuses digit strings longer than 4300 characters (Python >= 3.11's default
//!   `sys.set_int_max_str_digits`), and `torch.tensor` refuses integers beyond int64: in both cases the
//!   reference raises ([`Raise`]).
//!
//! All offsets are byte offsets on char boundaries.

/// The reference raised an exception (an out-of-range location bin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raise;

/// Python's `str.isspace()`.
pub(crate) fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()` (no argument).
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(py_isspace)
}

/// Code points of the digit zero of every Unicode decimal-digit (Nd) block, as Python 3.11 (Unicode 14.0)
/// knows them; each block is the ten consecutive code points starting at its zero.
const ND_ZEROS: [u32; 66] = [
    0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66,
    0xDE6, 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90,
    0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10,
    0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650,
    0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50,
    0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0,
];

/// The value of a character matched by Python's `\d` (and accepted by `int()`), else `None`.
pub(crate) fn decimal_value(c: char) -> Option<u32> {
    let cp = u32::from(c);
    if c.is_ascii() {
        return c.to_digit(10);
    }
    // The last zero at or below cp (the table is sorted).
    let idx = ND_ZEROS.partition_point(|&z| z <= cp);
    let zero = *ND_ZEROS.get(idx.checked_sub(1)?)?;
    let v = cp - zero;
    (v < 10).then_some(v)
}

/// Python's `int()` limit on decimal digit strings (characters, leading zeros included).
const MAX_INT_DIGITS: usize = 4300;

/// Python's `int(digits)`: `Ok(Some(v))` for a value that fits int64, `Ok(None)` for a larger one (fine for
/// Python, but `torch.tensor` would raise on it, see [`to_int64`]), [`Raise`] beyond 4300 digits.
/// `digits` holds only characters accepted by [`decimal_value`].
pub(crate) fn py_int(digits: &str) -> Result<Option<u64>, Raise> {
    if digits.chars().count() > MAX_INT_DIGITS {
        return Err(Raise);
    }
    let mut v: u64 = 0;
    for c in digits.chars() {
        let d = decimal_value(c).ok_or(Raise)?;
        match v.checked_mul(10).and_then(|v| v.checked_add(u64::from(d))) {
            Some(n) if n <= i64::MAX as u64 => v = n,
            _ => return Ok(None),
        }
    }
    Ok(Some(v))
}

/// `torch.tensor` of a Python int: int64 or [`Raise`].
pub(crate) fn to_int64(v: Option<u64>) -> Result<u64, Raise> {
    v.ok_or(Raise)
}

/// A `<loc_\d+>` token found in a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// Byte range of the digits.
    pub digits: (usize, usize),
    /// End of the token (after `>`).
    pub end: usize,
}

impl Loc {
    pub fn digits<'a>(&self, s: &'a str) -> &'a str {
        s.get(self.digits.0..self.digits.1).unwrap_or("")
    }
}

/// The `<loc_\d+>` token starting at byte `at`, if any.
pub(crate) fn loc_at(s: &str, at: usize) -> Option<Loc> {
    let rest = s.get(at..)?;
    let after = rest.strip_prefix("<loc_")?;
    let start = at + 5;
    let mut end = start;
    for c in after.chars() {
        if decimal_value(c).is_none() {
            break;
        }
        end += c.len_utf8();
    }
    if end == start || s.get(end..)?.as_bytes().first() != Some(&b'>') {
        return None;
    }
    Some(Loc {
        digits: (start, end),
        end: end + 1,
    })
}

/// The polygon-family tokens the reference's polygon pattern accepts besides `<loc_\d+>`.
pub(crate) const SEP: &str = "<sep>";
pub(crate) const POLY: &str = "<poly>";
pub(crate) const POLY_END: &str = "</poly>";

/// End of one token of the set {`<loc_\d+>`} (or, with `polygon`, {`<loc_\d+>`, `<sep>`, `<poly>`,
/// `</poly>`}) starting at `at`.
pub(crate) fn token_end(s: &str, at: usize, polygon: bool) -> Option<usize> {
    if let Some(loc) = loc_at(s, at) {
        return Some(loc.end);
    }
    if polygon {
        let rest = s.get(at..)?;
        for t in [SEP, POLY, POLY_END] {
            if rest.starts_with(t) {
                return Some(at + t.len());
            }
        }
    }
    None
}

/// `(?:TOKEN){min,}` (greedy) at `at`: the end of the maximal run of tokens if it has at least `min`
/// tokens, else `None`. A failed probe has scanned fewer than `min` tokens, so probing costs a bounded
/// number of scans per token.
pub(crate) fn token_run(s: &str, at: usize, polygon: bool, min: usize) -> Option<usize> {
    let mut end = at;
    let mut n = 0usize;
    while let Some(e) = token_end(s, end, polygon) {
        end = e;
        n += 1;
    }
    (n >= min).then_some(end)
}

/// The character starting at byte `at` (the caller keeps `at` on a boundary below `s.len()`).
pub(crate) fn char_at(s: &str, at: usize) -> Option<char> {
    s.get(at..)?.chars().next()
}

/// `re.search(r"^\s*(.*?)(?=T1|T2|...)", s)`: the whole match (to be stripped by the caller), or `None`.
/// The lazy `.*?` stops at the first position where one of `targets` starts and cannot cross `\n`.
pub(crate) fn leading_phrase<'a>(s: &'a str, targets: &[&str]) -> Option<&'a str> {
    let ws_end = s
        .char_indices()
        .find(|&(_, c)| !py_isspace(c))
        .map_or(s.len(), |(i, _)| i);
    let mut j = ws_end;
    loop {
        let rest = s.get(j..)?;
        if targets.iter().any(|t| rest.starts_with(t)) {
            return s.get(..j);
        }
        let c = rest.chars().next()?;
        if c == '\n' {
            return None;
        }
        j += c.len_utf8();
    }
}

/// `re.finditer(r"<loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)>", s)`: the four locs of each match.
pub(crate) fn find_quads(s: &str) -> Vec<[Loc; 4]> {
    let mut out = Vec::new();
    let mut p = 0;
    while p < s.len() {
        if let Some(quad) = four_locs(s, p) {
            p = quad[3].end;
            out.push(quad);
        } else {
            p += char_at(s, p).map_or(1, char::len_utf8);
        }
    }
    out
}

fn four_locs(s: &str, at: usize) -> Option<[Loc; 4]> {
    let a = loc_at(s, at)?;
    let b = loc_at(s, a.end)?;
    let c = loc_at(s, b.end)?;
    let d = loc_at(s, c.end)?;
    Some([a, b, c, d])
}

/// All `<loc_\d+>` tokens of a run of consecutive loc tokens starting at `at` (possibly none).
pub(crate) fn loc_chain(s: &str, at: usize) -> Vec<Loc> {
    let mut out = Vec::new();
    let mut p = at;
    while let Some(loc) = loc_at(s, p) {
        p = loc.end;
        out.push(loc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_digits_are_pythons() {
        for (c, v) in [
            ('0', 0),
            ('9', 9),
            ('٣', 3),
            ('४', 4),
            ('９', 9),
            ('\u{1D7CE}', 0),
            ('\u{1D7FF}', 9),
        ] {
            assert_eq!(decimal_value(c), Some(v), "{c:?}");
        }
        for c in [
            'a',
            '½',
            '²',
            '\u{2160}',
            '/',
            ':',
            '\u{65F}',
            '\u{66A}',
            '\u{1FBFA}',
        ] {
            assert_eq!(decimal_value(c), None, "{c:?}");
        }
    }

    #[test]
    fn whitespace_is_pythons() {
        for c in ['\u{1c}', '\u{1f}', ' ', '\u{85}', '\u{3000}', '\u{2029}'] {
            assert!(py_isspace(c), "{c:?}");
        }
        for c in ['\u{200b}', '\u{180e}', '\u{feff}', 'a', '\u{0}'] {
            assert!(!py_isspace(c), "{c:?}");
        }
        assert_eq!(py_strip("\u{1c} a b \u{3000}"), "a b");
    }

    #[test]
    fn python_int_limits() {
        assert_eq!(py_int("0042"), Ok(Some(42)));
        assert_eq!(py_int("١٢"), Ok(Some(12)));
        assert_eq!(py_int("9223372036854775807"), Ok(Some(i64::MAX as u64)));
        assert_eq!(py_int("9223372036854775808"), Ok(None));
        assert_eq!(py_int(&"9".repeat(4300)), Ok(None));
        assert_eq!(py_int(&"0".repeat(4301)), Err(Raise));
        assert_eq!(to_int64(None), Err(Raise));
    }

    #[test]
    fn lookahead_phrase() {
        assert_eq!(leading_phrase("  cat <loc_1>", &["<loc_"]), Some("  cat "));
        assert_eq!(leading_phrase("\n cat<loc_1>", &["<loc_"]), Some("\n cat"));
        assert_eq!(leading_phrase("a\ncat<loc_1>", &["<loc_"]), None);
        assert_eq!(leading_phrase("cat", &["<loc_"]), None);
    }
}
