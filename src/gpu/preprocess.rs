//! WGSL preprocessing: one shader source yields several variants, resolved on the host before the
//! source reaches the WGSL compiler (naga natively, Tint in the browser). WGSL itself has no conditional
//! compilation; `override` constants cover sizes and flags *inside* function bodies, but not what the
//! module declares: a binding's access mode (`read` vs `read_write` for an in-place variant), an element
//! type (`f32` vs `vec4<f32>`), an `enable` directive, or a whole function. Those differ per variant here.
//!
//! # Syntax
//! A directive is a line whose first non-blank character is `#`; every other line is WGSL, kept or dropped
//! as a whole.
//! ```text
//! #if NAME          keep the lines up to the matching #else / #endif iff NAME is defined
//! #if !NAME         ... iff NAME is not defined
//! #else             the other branch of the innermost open #if
//! #endif            close the innermost #if
//! #include NAME     insert snippet NAME (shaders/include/NAME.wgsl, see `gpu::INCLUDES`), preprocessed
//!                   with the same defines; inside a dropped branch it is not read
//! ```
//! Blocks nest. `NAME` is an identifier (`[A-Za-z_][A-Za-z0-9_]*`, by convention upper case). Defines
//! are plain flags: a variant is the set of names that are defined. There is no text substitution.
//! Numbers that Rust and WGSL must agree on are written once, in Rust: fixed ones (workgroup sizes, tile
//! sizes, workgroup-memory capacities) are the shader's [`crate::gpu::Shader::consts`], appended to every
//! variant as WGSL `const` declarations by [`consts`] (module-scope declarations may follow their use);
//! per-launch ones are `override` constants that the launcher sets ([`crate::gpu::Kernel::with`]).
//!
//! Anything else after `#` (`#ifdef`, `#define`, `#elif`, a typo) is an error, as are an `#else` or
//! `#endif` without an `#if`, a second `#else`, an `#if` left open at the end of a file, an unknown
//! snippet, includes nested deeper than [`MAX_INCLUDE_DEPTH`] (a cycle), and a define that no `#if` of
//! the shader tests (a misspelt variant would otherwise silently compile the default).
//!
//! Dropped lines and directive lines become empty lines, so a compiler message's line number points at
//! the same line of the source file (until the first `#include`, which inserts its snippet's lines).
//!
//! Variants of one source are checked together: [`flags`] lists the names a shader tests, and
//! `tests/kernels/shader_variants.rs` / `scripts/ci/check_wgsl.mjs` compile every combination of them.

use std::collections::BTreeSet;

use crate::error::{Error, Result};

/// Deepest `#include` nesting accepted (deeper means a cycle).
pub const MAX_INCLUDE_DEPTH: usize = 8;

/// A snippet resolver: the source of `#include NAME`, or `None` when there is no such snippet.
pub type Resolve<'r> = &'r dyn Fn(&str) -> Option<&'static str>;

/// One parsed directive line.
#[derive(Debug, PartialEq, Eq)]
enum Directive<'s> {
    If { name: &'s str, negated: bool },
    Else,
    Endif,
    Include(&'s str),
}

fn err(shader: &str, line: usize, msg: impl std::fmt::Display) -> Error {
    Error::Shader(format!("{shader}:{line}: {msg}"))
}

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// Parse `line` as a directive: `Ok(None)` for a WGSL line.
fn parse<'s>(shader: &str, n: usize, line: &'s str) -> Result<Option<Directive<'s>>> {
    let Some(rest) = line.trim_start().strip_prefix('#') else {
        return Ok(None);
    };
    let mut words = rest.split_whitespace();
    let keyword = words.next().unwrap_or("");
    let arg = words.next();
    if !matches!(keyword, "if" | "else" | "endif" | "include") {
        return Err(err(
            shader,
            n,
            format!("unknown directive '#{keyword}' (known: #if, #else, #endif, #include)"),
        ));
    }
    if let Some(extra) = words.next() {
        return Err(err(
            shader,
            n,
            format!("unexpected '{extra}' after #{keyword}"),
        ));
    }
    let ident = |a: Option<&'s str>| -> Result<&'s str> {
        match a {
            Some(a) if is_ident(a) => Ok(a),
            Some(a) => Err(err(shader, n, format!("#{keyword}: '{a}' is not a name"))),
            None => Err(err(shader, n, format!("#{keyword} needs a name"))),
        }
    };
    let d = match keyword {
        "if" => {
            let a = arg.unwrap_or("");
            let (negated, name) = match a.strip_prefix('!') {
                Some(n) => (true, n),
                None => (false, a),
            };
            Directive::If {
                name: ident(Some(name).filter(|n| !n.is_empty()))?,
                negated,
            }
        }
        "else" | "endif" => {
            if let Some(a) = arg {
                return Err(err(shader, n, format!("unexpected '{a}' after #{keyword}")));
            }
            if keyword == "else" {
                Directive::Else
            } else {
                Directive::Endif
            }
        }
        _ => Directive::Include(ident(arg)?),
    };
    Ok(Some(d))
}

/// An open `#if` block.
struct Block {
    line: usize,
    /// Lines of this branch are kept.
    active: bool,
    /// The enclosing block is active (an `#else` of a dropped block stays dropped).
    parent_active: bool,
    seen_else: bool,
}

/// What one pass over a source collects.
struct Walk<'a> {
    defines: &'a [&'a str],
    resolve: Resolve<'a>,
    tested: BTreeSet<String>,
    out: String,
}

impl Walk<'_> {
    fn run(&mut self, shader: &str, source: &str, depth: usize) -> Result<()> {
        let mut stack: Vec<Block> = Vec::new();
        for (i, line) in source.lines().enumerate() {
            let n = i + 1;
            let active = stack.last().is_none_or(|b| b.active);
            let Some(d) = parse(shader, n, line)? else {
                if active {
                    self.out.push_str(line);
                }
                self.out.push('\n');
                continue;
            };
            match d {
                Directive::If { name, negated } => {
                    self.tested.insert(name.to_string());
                    let defined = self.defines.contains(&name);
                    stack.push(Block {
                        line: n,
                        active: active && defined != negated,
                        parent_active: active,
                        seen_else: false,
                    });
                }
                Directive::Else => {
                    let b = stack
                        .last_mut()
                        .ok_or_else(|| err(shader, n, "#else without #if"))?;
                    if b.seen_else {
                        return Err(err(
                            shader,
                            n,
                            format!("second #else for the #if of line {}", b.line),
                        ));
                    }
                    b.seen_else = true;
                    b.active = b.parent_active && !b.active;
                }
                Directive::Endif => {
                    stack
                        .pop()
                        .ok_or_else(|| err(shader, n, "#endif without #if"))?;
                }
                Directive::Include(name) => {
                    if active {
                        if depth >= MAX_INCLUDE_DEPTH {
                            return Err(err(
                                shader,
                                n,
                                format!(
                                    "#include {name}: nested deeper than {MAX_INCLUDE_DEPTH} (a cycle?)"
                                ),
                            ));
                        }
                        let src = (self.resolve)(name).ok_or_else(|| {
                            err(shader, n, format!("#include {name}: no such snippet"))
                        })?;
                        self.run(name, src, depth + 1)?;
                        continue; // the snippet's lines replace the directive's
                    }
                }
            }
            self.out.push('\n');
        }
        if let Some(b) = stack.last() {
            return Err(err(shader, b.line, "#if without #endif"));
        }
        Ok(())
    }
}

/// The WGSL of `source` (named `shader` in errors) with `defines` defined. Fails on malformed directives,
/// unknown snippets and on a define that no `#if` of the source (or of its included snippets) tests.
pub fn preprocess(
    shader: &str,
    source: &str,
    defines: &[&str],
    resolve: Resolve<'_>,
) -> Result<String> {
    let mut w = Walk {
        defines,
        resolve,
        tested: BTreeSet::new(),
        out: String::with_capacity(source.len()),
    };
    w.run(shader, source, 0)?;
    if let Some(unused) = defines.iter().find(|d| !w.tested.contains(**d)) {
        return Err(Error::Shader(format!(
            "{shader}: define '{unused}' is not tested by any #if (known: {:?})",
            w.tested
        )));
    }
    Ok(w.out)
}

/// The WGSL declarations of a shader's shared sizes: one `const NAME: u32 = VALUEu;` line each, after a
/// comment saying where they come from. Appended after the source, so line numbers stay the source's.
pub fn consts(consts: &[(&str, u32)]) -> String {
    if consts.is_empty() {
        return String::new();
    }
    let mut out =
        String::from("\n// Sizes shared with the launcher (its Rust constants: Shader::consts).\n");
    for (name, value) in consts {
        out.push_str(&format!("const {name}: u32 = {value}u;\n"));
    }
    out
}

/// Every name an `#if` of `source` tests (snippets included whether or not their `#include` line is in a
/// kept branch, since some variant keeps it), sorted. Its subsets are the shader's variants.
pub fn flags(shader: &str, source: &str, resolve: Resolve<'_>) -> Result<Vec<String>> {
    let mut seen = BTreeSet::new();
    collect(shader, source, resolve, 0, &mut seen)?;
    Ok(seen.into_iter().collect())
}

fn collect(
    shader: &str,
    source: &str,
    resolve: Resolve<'_>,
    depth: usize,
    seen: &mut BTreeSet<String>,
) -> Result<()> {
    for (i, line) in source.lines().enumerate() {
        match parse(shader, i + 1, line)? {
            Some(Directive::If { name, .. }) => {
                seen.insert(name.to_string());
            }
            Some(Directive::Include(name)) => {
                if depth >= MAX_INCLUDE_DEPTH {
                    return Err(err(
                        shader,
                        i + 1,
                        format!("#include {name}: nested too deep"),
                    ));
                }
                let src = resolve(name).ok_or_else(|| {
                    err(shader, i + 1, format!("#include {name}: no such snippet"))
                })?;
                collect(name, src, resolve, depth + 1, seen)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// All subsets of `flags` (2^n variants; shaders keep n small).
pub fn variants(flags: &[String]) -> Vec<Vec<&str>> {
    (0u32..1 << flags.len())
        .map(|mask| {
            flags
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, f)| f.as_str())
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<&'static str> {
        None
    }

    fn pp(src: &str, defines: &[&str]) -> Result<String> {
        preprocess("t", src, defines, &none)
    }

    /// The kept WGSL lines, without the blank placeholders.
    fn kept(src: &str, defines: &[&str]) -> Vec<String> {
        pp(src, defines)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn if_else_selects_a_branch_and_keeps_line_numbers() {
        let src = "a\n#if X\nb\n#else\nc\n#endif\nd\n";
        assert_eq!(kept(src, &["X"]), ["a", "b", "d"]);
        assert_eq!(kept(src, &[]), ["a", "c", "d"]);
        let out = pp(src, &[]).unwrap();
        assert_eq!(out.lines().count(), src.lines().count());
        assert_eq!(out.lines().nth(4), Some("c"), "line 5 stays line 5");
    }

    #[test]
    fn negation() {
        let src = "#if !X\nno_x\n#else\nx\n#endif\n";
        assert_eq!(kept(src, &[]), ["no_x"]);
        assert_eq!(kept(src, &["X"]), ["x"]);
    }

    #[test]
    fn nesting() {
        let src = "#if A\na\n  #if B\n  ab\n  #else\n  a_not_b\n  #endif\n#else\n#if B\nnot_a_b\n#endif\nnot_a\n#endif\nend\n";
        assert_eq!(kept(src, &["A", "B"]), ["a", "  ab", "end"]);
        assert_eq!(kept(src, &["A"]), ["a", "  a_not_b", "end"]);
        assert_eq!(kept(src, &["B"]), ["not_a_b", "not_a", "end"]);
        assert_eq!(kept(src, &[]), ["not_a", "end"]);
    }

    #[test]
    fn else_inside_a_dropped_block_stays_dropped() {
        let src = "#if A\n#if B\nab\n#else\na_not_b\n#endif\n#endif\n";
        assert!(kept(src, &["B"]).is_empty());
        assert!(kept(src, &[]).is_empty());
    }

    fn error(src: &str, defines: &[&str]) -> String {
        match pp(src, defines) {
            Err(Error::Shader(m)) => m,
            other => panic!("expected a shader error, got {other:?}"),
        }
    }

    #[test]
    fn unknown_directives_are_errors() {
        assert!(error("a\n#ifdef X\n#endif\n", &[]).contains("t:2: unknown directive '#ifdef'"));
        assert!(error("#define X 1\n", &[]).contains("unknown directive '#define'"));
        assert!(error("#elif X\n", &[]).contains("unknown directive"));
        assert!(error("#\n", &[]).contains("unknown directive"));
    }

    #[test]
    fn malformed_directives_are_errors() {
        assert!(error("#if\n#endif\n", &[]).contains("t:1: #if needs a name"));
        assert!(error("#if !\n#endif\n", &[]).contains("needs a name"));
        assert!(error("#if 1X\n#endif\n", &[]).contains("'1X' is not a name"));
        assert!(error("#if A B\n#endif\n", &["A"]).contains("unexpected 'B'"));
        assert!(error("#if A\n#endif A\n", &["A"]).contains("unexpected 'A' after #endif"));
        assert!(error("#include\n", &[]).contains("#include needs a name"));
    }

    #[test]
    fn unbalanced_blocks_are_errors() {
        assert!(error("a\n#if X\nb\n", &["X"]).contains("t:2: #if without #endif"));
        assert!(error("#if X\n#if Y\n#endif\n", &[]).contains("t:1: #if without #endif"));
        assert!(error("#endif\n", &[]).contains("t:1: #endif without #if"));
        assert!(error("#else\n", &[]).contains("#else without #if"));
        assert!(error("#if X\n#else\n#else\n#endif\n", &[]).contains("t:3: second #else"));
    }

    #[test]
    fn a_define_no_if_tests_is_an_error() {
        assert!(error("#if X\n#endif\n", &["Y"]).contains("define 'Y' is not tested"));
    }

    #[test]
    fn wgsl_attributes_and_comments_are_not_directives() {
        let src = "@compute @workgroup_size(64)\n// #if X is only a comment\nfn f() {}\n";
        assert_eq!(kept(src, &[]).len(), 3);
    }

    const SNIP: &str = "fn helper() {}\n#if X\nfn helper_x() {}\n#endif\n";
    const LOOP: &str = "#include lp\n";

    fn resolve(name: &str) -> Option<&'static str> {
        match name {
            "snip" => Some(SNIP),
            "outer" => Some("#include snip\n"),
            "lp" => Some(LOOP),
            _ => None,
        }
    }

    #[test]
    fn includes_are_inserted_with_the_same_defines() {
        let src = "#include outer\nfn main() {}\n";
        let out = preprocess("t", src, &["X"], &resolve).unwrap();
        let lines: Vec<_> = out.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(
            lines,
            ["fn helper() {}", "fn helper_x() {}", "fn main() {}"]
        );
        let out = preprocess("t", src, &[], &resolve).unwrap();
        assert!(!out.contains("helper_x"));
        assert_eq!(flags("t", src, &resolve).unwrap(), ["X"]);
    }

    #[test]
    fn includes_in_dropped_branches_are_not_read() {
        let src = "#if X\n#include missing\n#endif\n";
        assert!(preprocess("t", src, &[], &resolve).is_ok());
        let m = preprocess("t", src, &["X"], &resolve)
            .unwrap_err()
            .to_string();
        assert!(m.contains("t:2: #include missing: no such snippet"), "{m}");
    }

    #[test]
    fn include_cycles_are_errors() {
        let m = preprocess("t", "#include lp\n", &[], &resolve)
            .unwrap_err()
            .to_string();
        assert!(m.contains("nested deeper than 8"), "{m}");
        assert!(flags("t", "#include lp\n", &resolve).is_err());
    }

    #[test]
    fn variants_are_all_subsets() {
        let f = vec!["A".to_string(), "B".to_string()];
        let v = variants(&f);
        assert_eq!(v.len(), 4);
        assert!(v.contains(&vec![]) && v.contains(&vec!["A", "B"]));
        assert_eq!(variants(&[]), vec![Vec::<&str>::new()]);
    }

    #[test]
    fn consts_are_u32_declarations_after_the_source() {
        assert_eq!(consts(&[]), "");
        let c = consts(&[("WG", 256), ("TILE", 32)]);
        let decls: Vec<&str> = c.lines().filter(|l| l.starts_with("const")).collect();
        assert_eq!(decls, ["const WG: u32 = 256u;", "const TILE: u32 = 32u;"]);
    }
}
