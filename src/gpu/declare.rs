//! One declaration per kernel: [`shader!`](crate::gpu::shader) yields a launcher's [`Shader`] (its WGSL
//! file under `shaders/` and the sizes the launcher shares with it), [`uniform!`](crate::gpu::uniform) its
//! `Params` uniform: a `#[repr(C)]` plain-old-data struct whose size is checked at compile time against
//! WGSL's 16-byte uniform rounding, and (in tests) a [`UniformLayout`] that `ops`' layout test compares
//! field by field with the WGSL struct it mirrors.
//!
//! [`Shader`]: crate::gpu::Shader

/// `shader!(pub static SHADER = "cast", [("WG", WG)]);` declares `shaders/cast.wgsl` with the WGSL
/// constants `WG` (see [`crate::gpu::Shader::consts`]). Only for launchers in `src/ops/` (the path is
/// relative to this file's depth, which they share).
macro_rules! shader {
    ($(#[$m:meta])* $vis:vis static $id:ident = $name:literal, [$(($c:literal, $v:expr)),* $(,)?]) => {
        $(#[$m])*
        $vis static $id: $crate::gpu::Shader = $crate::gpu::Shader {
            name: $name,
            source: include_str!(concat!("../../shaders/", $name, ".wgsl")),
            consts: &[$(($c, $v)),*],
        };
    };
}

/// Declares a uniform that mirrors a WGSL struct:
/// `uniform! { struct Params: PARAMS_LAYOUT = "cast" / Params { n: u32, words: u32, _pad0: u32, _pad1: u32 } }`
/// mirrors `struct Params` of `shaders/cast.wgsl` (an include: `"include/attn_params"`). Fields are
/// `u32`, `f32` or `[u32; 4]` (WGSL `vec4<u32>`), in the WGSL order and with the WGSL names.
macro_rules! uniform {
    (
        $(#[$m:meta])*
        $vis:vis struct $name:ident: $layout:ident = $file:literal / $wgsl:ident {
            $($f:ident: $t:ty),* $(,)?
        }
    ) => {
        #[doc = concat!("Mirrors `", stringify!($wgsl), "` in `shaders/", $file, ".wgsl`.")]
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $($f: $t),*
        }

        // WGSL rounds a uniform struct up to 16 bytes; the Rust mirror must match to the byte.
        const _: () = assert!(std::mem::size_of::<$name>() % 16 == 0);

        #[cfg(test)]
        pub(crate) const $layout: $crate::gpu::declare::UniformLayout =
            $crate::gpu::declare::UniformLayout {
                file: $file,
                wgsl: include_str!(concat!("../../shaders/", $file, ".wgsl")),
                name: stringify!($wgsl),
                fields: &[$(stringify!($f)),*],
                size: std::mem::size_of::<$name>(),
            };
    };
}

pub(crate) use shader;
pub(crate) use uniform;

/// A declared uniform as the layout test sees it (tests only).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct UniformLayout {
    pub file: &'static str,
    pub wgsl: &'static str,
    pub name: &'static str,
    pub fields: &'static [&'static str],
    pub size: usize,
}

#[cfg(test)]
impl UniformLayout {
    /// The (name, byte size) fields of `struct NAME { ... }` in the WGSL source.
    pub fn wgsl_fields(&self) -> Result<Vec<(String, usize)>, String> {
        let head = format!("struct {} {{", self.name);
        let start = self
            .wgsl
            .find(&head)
            .ok_or_else(|| format!("{}: no `{head}`", self.file))?;
        let body = &self.wgsl[start + head.len()..];
        let body = &body[..body.find('}').unwrap_or(body.len())];
        let mut out = Vec::new();
        for line in body.lines() {
            let code = line.split("//").next().unwrap_or("").trim();
            let Some((name, ty)) = code.trim_end_matches(',').split_once(':') else {
                continue;
            };
            let ty = ty.trim();
            let size = match ty {
                "u32" | "f32" | "i32" => 4,
                "vec4<u32>" | "vec4<f32>" | "vec4<i32>" => 16,
                _ => return Err(format!("{}: field type `{ty}` not mirrored", self.file)),
            };
            out.push((name.trim().to_string(), size));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    uniform! {
        struct Probe: PROBE = "cast" / Params { n: u32, words: u32, _pad0: u32, _pad1: u32 }
    }

    #[test]
    fn a_declared_uniform_is_16_byte_plain_data_with_its_wgsl_names() {
        let p = Probe {
            n: 3,
            words: 2,
            _pad0: 0,
            _pad1: 0,
        };
        assert_eq!(
            bytemuck::bytes_of(&p),
            &[3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(PROBE.fields, ["n", "words", "_pad0", "_pad1"]);
        let wgsl = PROBE.wgsl_fields().unwrap();
        let names: Vec<&str> = wgsl.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, PROBE.fields);
        assert_eq!(wgsl.iter().map(|f| f.1).sum::<usize>(), PROBE.size);
    }

    #[test]
    fn a_missing_struct_or_an_unknown_field_type_is_reported() {
        let missing = UniformLayout {
            name: "Nope",
            ..PROBE
        };
        assert!(missing
            .wgsl_fields()
            .unwrap_err()
            .contains("no `struct Nope {`"));
        let odd = UniformLayout {
            wgsl: "struct Params {\n  m: mat4x4<f32>,\n}",
            ..PROBE
        };
        assert!(odd.wgsl_fields().unwrap_err().contains("mat4x4<f32>"));
    }
}
