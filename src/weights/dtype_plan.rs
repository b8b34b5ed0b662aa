//! A weight format per module: a [`DTypePlan`] gives each of the model's five parts ([`Part`]) its own
//! [`WeightDType`], and [`part_of`] says which part a checkpoint tensor belongs to. The assembler asks
//! the plan for each tensor's format; within a part the uniform format's rules apply unchanged (norms,
//! biases, depthwise convolutions and position tables stay f32, dense convolutions follow
//! [`WeightDType::conv_dtype`], matrices with partial blocks fall back to f16), so every module of a
//! mixed load holds exactly the bytes the uniform load of its format holds.
//!
//! Text form (CLI, server, JS string): one format (`"fp16"`), or comma-separated `PART=FORMAT` entries
//! (`"vision=fp16,text=q4"`) where `text` stands for encoder, decoder and embed; a bare format among
//! the entries (`"q4,vision=fp16"`) sets the parts no entry names, which otherwise take fp16 (the
//! default format), except that the projector follows `vision` when only `vision` is named (so
//! `"vision=fp16,text=q4"` covers the whole model, as the q4 policy study grouped it). Later entries
//! override earlier ones.

use crate::error::{Error, Result};
use crate::gpu::DType;
use crate::weights::dtype::WeightDType;

/// A part of the model with its own weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    /// The DaViT vision tower (`model.vision_tower.*`).
    Vision,
    /// The image projection, its norm and the image position tables (`model.multi_modal_projector.*`).
    Projector,
    /// The BART encoder's layers and position table.
    Encoder,
    /// The BART decoder's layers and position table.
    Decoder,
    /// The shared token embedding and the LM head (tied to it unless the checkpoint holds its own).
    Embed,
}

/// The names a part may be given as, for error messages.
pub const PART_NAMES: &str = "vision, projector, encoder, decoder, embed or text";

impl Part {
    pub const ALL: [Part; 5] = [
        Part::Vision,
        Part::Projector,
        Part::Encoder,
        Part::Decoder,
        Part::Embed,
    ];
    /// The parts `text` stands for.
    pub const TEXT: [Part; 3] = [Part::Encoder, Part::Decoder, Part::Embed];

    pub fn as_str(self) -> &'static str {
        match self {
            Part::Vision => "vision",
            Part::Projector => "projector",
            Part::Encoder => "encoder",
            Part::Decoder => "decoder",
            Part::Embed => "embed",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The parts a name stands for (`text`: encoder, decoder, embed), case-insensitive.
    pub fn parse_group(name: &str) -> Result<&'static [Part]> {
        Ok(match name.trim().to_ascii_lowercase().as_str() {
            "vision" => &[Part::Vision],
            "projector" => &[Part::Projector],
            "encoder" => &[Part::Encoder],
            "decoder" => &[Part::Decoder],
            "embed" => &[Part::Embed],
            "text" => &Part::TEXT,
            _ => {
                return Err(Error::UnknownModelPart {
                    got: name.chars().take(32).collect(),
                    expected: PART_NAMES,
                })
            }
        })
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The part a canonical (HF-native) tensor name belongs to; `None` for a name outside the model.
pub fn part_of(canonical: &str) -> Option<Part> {
    const LM: &str = "model.language_model.";
    if canonical.starts_with("model.vision_tower.") {
        Some(Part::Vision)
    } else if canonical.starts_with("model.multi_modal_projector.") {
        Some(Part::Projector)
    } else if canonical == "lm_head.weight" || canonical == crate::weights::FINAL_LOGITS_BIAS {
        Some(Part::Embed)
    } else if let Some(rest) = canonical.strip_prefix(LM) {
        // `encoder.embed_tokens` / `decoder.embed_tokens` are the shared table under other names.
        if rest.starts_with("shared.") || rest.contains("embed_tokens.") {
            Some(Part::Embed)
        } else if rest.starts_with("encoder.") {
            Some(Part::Encoder)
        } else if rest.starts_with("decoder.") {
            Some(Part::Decoder)
        } else {
            None
        }
    } else {
        None
    }
}

/// A weight format per part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DTypePlan {
    parts: [WeightDType; 5],
}

impl Default for DTypePlan {
    /// Uniform fp16 ([`WeightDType::default`]).
    fn default() -> Self {
        DTypePlan::uniform(WeightDType::default())
    }
}

impl From<WeightDType> for DTypePlan {
    fn from(d: WeightDType) -> Self {
        DTypePlan::uniform(d)
    }
}

impl From<DType> for DTypePlan {
    /// The uniform plan whose matrices are resident as `d` ([`WeightDType::of_matrix_dtype`]).
    fn from(d: DType) -> Self {
        DTypePlan::uniform(WeightDType::of_matrix_dtype(d))
    }
}

impl PartialEq<WeightDType> for DTypePlan {
    /// A plan equals a format when it is that format uniformly.
    fn eq(&self, other: &WeightDType) -> bool {
        self.as_uniform() == Some(*other)
    }
}

impl DTypePlan {
    /// Every part in `d`.
    pub const fn uniform(d: WeightDType) -> Self {
        DTypePlan { parts: [d; 5] }
    }

    /// `vision` and `projector` in `vision`, encoder, decoder and embed in `text`.
    pub const fn vision_text(vision: WeightDType, text: WeightDType) -> Self {
        DTypePlan {
            parts: [vision, vision, text, text, text],
        }
    }

    /// Each part's format, in [`Part::ALL`] order.
    pub const fn from_parts(parts: [WeightDType; 5]) -> Self {
        DTypePlan { parts }
    }

    /// The format of `part`.
    pub fn get(&self, part: Part) -> WeightDType {
        self.parts[part.index()]
    }

    /// This plan with `part` in `d`.
    pub fn with(mut self, part: Part, d: WeightDType) -> Self {
        self.parts[part.index()] = d;
        self
    }

    /// The one format of every part, when the plan is uniform.
    pub fn as_uniform(&self) -> Option<WeightDType> {
        let first = self.parts[0];
        self.parts.iter().all(|&d| d == first).then_some(first)
    }

    /// Whether some part is quantized (q8 or q4).
    pub fn any_quantized(&self) -> bool {
        self.parts
            .iter()
            .any(|d| matches!(d, WeightDType::Q8 | WeightDType::Q4))
    }

    /// The format of the tensor of canonical name `name` (the embed part's for a name outside the
    /// model: the planner never plans one, and the LM head's rules are the loosest).
    pub fn for_tensor(&self, name: &str) -> WeightDType {
        self.get(part_of(name).unwrap_or(Part::Embed))
    }

    /// Each part with its format, in [`Part::ALL`] order.
    pub fn parts(&self) -> impl Iterator<Item = (Part, WeightDType)> + '_ {
        Part::ALL.into_iter().map(|p| (p, self.get(p)))
    }

    /// The text form: the format alone when uniform, else `vision=..` (then `projector=..` when it
    /// differs) and `text=..` when encoder, decoder and embed agree (each part named otherwise).
    /// [`str::parse`] reads it back.
    pub fn label(&self) -> String {
        if let Some(d) = self.as_uniform() {
            return d.as_str().to_owned();
        }
        let mut out = vec![format!("vision={}", self.get(Part::Vision))];
        if self.get(Part::Projector) != self.get(Part::Vision) {
            out.push(format!("projector={}", self.get(Part::Projector)));
        }
        let text = self.get(Part::Encoder);
        if Part::TEXT.iter().all(|&p| self.get(p) == text) {
            out.push(format!("text={text}"));
        } else {
            for p in Part::TEXT {
                out.push(format!("{p}={}", self.get(p)));
            }
        }
        out.join(",")
    }

    /// A plan from `(part name, format name)` pairs (a JS object's entries), over a default format
    /// for the parts not named (fp16 unless a pair named `default` or `*` sets it; the projector
    /// follows `vision` when only that is named).
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self> {
        let entries: Vec<(&str, &str)> = entries.into_iter().collect();
        let mut base = WeightDType::default();
        for (k, v) in &entries {
            if matches!(k.trim(), "default" | "*") {
                base = v.trim().parse()?;
            }
        }
        let mut plan = DTypePlan::uniform(base);
        let mut named = Vec::new();
        for (k, v) in entries {
            if matches!(k.trim(), "default" | "*") {
                continue;
            }
            let parts = Part::parse_group(k)?;
            let d: WeightDType = v.trim().parse()?;
            for &p in parts {
                plan = plan.with(p, d);
                named.push(p);
            }
        }
        if named.contains(&Part::Vision) && !named.contains(&Part::Projector) {
            plan = plan.with(Part::Projector, plan.get(Part::Vision));
        }
        Ok(plan)
    }
}

impl std::fmt::Display for DTypePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl serde::Serialize for DTypePlan {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

impl std::str::FromStr for DTypePlan {
    type Err = Error;
    /// One format, or `PART=FORMAT` entries with at most a bare format among them (module docs).
    fn from_str(s: &str) -> Result<Self> {
        if !s.contains('=') {
            return s.trim().parse::<WeightDType>().map(DTypePlan::uniform);
        }
        let mut entries = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            entries.push(item.split_once('=').unwrap_or(("default", item)));
        }
        if entries.is_empty() {
            return Err(Error::UnknownDType {
                got: s.chars().take(32).collect(),
                expected: "fp32, fp16, q8 or q4, or PART=FORMAT entries",
            });
        }
        DTypePlan::from_entries(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WeightDType::{Fp16, Fp32, Q4, Q8};

    #[test]
    fn parses_one_format_and_part_maps() {
        assert_eq!(
            "fp16".parse::<DTypePlan>().unwrap(),
            DTypePlan::uniform(Fp16)
        );
        assert_eq!(" Q4 ".parse::<DTypePlan>().unwrap(), DTypePlan::uniform(Q4));
        let p: DTypePlan = "vision=fp16,text=q4".parse().unwrap();
        assert_eq!(p, DTypePlan::from_parts([Fp16, Fp16, Q4, Q4, Q4]));
        assert_eq!(p, DTypePlan::vision_text(Fp16, Q4));
        assert_eq!(p.label(), "vision=fp16,text=q4");
        assert_eq!(p.label().parse::<DTypePlan>().unwrap(), p);
        // A bare format sets the parts no entry names (the projector follows vision); later entries
        // override earlier ones.
        let p: DTypePlan = "q4, vision=q8, decoder=fp32,projector=q4".parse().unwrap();
        let want = [Q8, Q4, Q4, Fp32, Q4];
        assert_eq!(p.parts().map(|(_, d)| d).collect::<Vec<_>>(), want);
        assert_eq!(
            p.label(),
            "vision=q8,projector=q4,encoder=q4,decoder=fp32,embed=q4"
        );
        let p: DTypePlan = "q4,vision=q8".parse().unwrap();
        assert_eq!(p, DTypePlan::from_parts([Q8, Q8, Q4, Q4, Q4]));
        let p: DTypePlan = "embed=q8,q4".parse().unwrap();
        assert_eq!(p, DTypePlan::from_parts([Q4, Q4, Q4, Q4, Q8]));
        assert_eq!(p.label(), "vision=q4,encoder=q4,decoder=q4,embed=q8");
        assert_eq!(p.label().parse::<DTypePlan>().unwrap(), p);
        let p: DTypePlan = "text=q8,embed=q4".parse().unwrap();
        assert_eq!(p.get(Part::Vision), Fp16);
        assert_eq!(p.get(Part::Encoder), Q8);
        assert_eq!(p.get(Part::Embed), Q4);
        assert_eq!(
            "vision=q4,text=q4".parse::<DTypePlan>().unwrap().label(),
            "q4"
        );
        assert_eq!(
            "VISION = fp16 , Text = Q4".parse::<DTypePlan>().unwrap(),
            DTypePlan::vision_text(Fp16, Q4)
        );
    }

    #[test]
    fn bad_parts_and_formats_are_named_errors() {
        let e = "visoin=fp16".parse::<DTypePlan>().unwrap_err();
        assert!(
            matches!(&e, Error::UnknownModelPart { got, .. } if got == "visoin"),
            "{e}"
        );
        assert!(e
            .to_string()
            .contains("vision, projector, encoder, decoder, embed or text"));
        let e = "vision=int3".parse::<DTypePlan>().unwrap_err();
        assert!(
            matches!(&e, Error::UnknownDType { got, .. } if got == "int3"),
            "{e}"
        );
        assert!(e.to_string().contains("fp32, fp16, q8 or q4"));
        assert!(matches!(
            "int3".parse::<DTypePlan>(),
            Err(Error::UnknownDType { .. })
        ));
        assert!(matches!(
            ",=,".parse::<DTypePlan>(),
            Err(Error::UnknownModelPart { .. })
        ));
        assert!(DTypePlan::from_entries([("vision", "fp16"), ("txt", "q4")]).is_err());
        let p = DTypePlan::from_entries([("*", "q8"), ("vision", "fp16")]).unwrap();
        assert_eq!(p, DTypePlan::vision_text(Fp16, Q8));
        let p = DTypePlan::from_entries([("projector", "q4"), ("vision", "fp16")]).unwrap();
        assert_eq!(p, DTypePlan::from_parts([Fp16, Q4, Fp16, Fp16, Fp16]));
    }

    #[test]
    fn canonical_names_map_to_parts() {
        let cases = [
            ("model.vision_tower.convs.0.conv.weight", Part::Vision),
            (
                "model.vision_tower.blocks.0.0.spatial_block.ffn.fc1.weight",
                Part::Vision,
            ),
            (
                "model.multi_modal_projector.image_projection.weight",
                Part::Projector,
            ),
            (
                "model.multi_modal_projector.image_position_embed.row_embeddings.weight",
                Part::Projector,
            ),
            (
                "model.language_model.encoder.layers.0.fc1.weight",
                Part::Encoder,
            ),
            (
                "model.language_model.encoder.embed_positions.weight",
                Part::Encoder,
            ),
            (
                "model.language_model.decoder.layers.5.encoder_attn.q_proj.weight",
                Part::Decoder,
            ),
            (
                "model.language_model.decoder.embed_tokens.weight",
                Part::Embed,
            ),
            ("model.language_model.shared.weight", Part::Embed),
            ("lm_head.weight", Part::Embed),
            ("final_logits_bias", Part::Embed),
        ];
        for (name, part) in cases {
            assert_eq!(part_of(name), Some(part), "{name}");
        }
        assert_eq!(part_of("vision_tower.convs.0.proj.weight"), None);
        assert_eq!(part_of("model.language_model.pooler.weight"), None);
        let p = DTypePlan::vision_text(Fp16, Q4);
        assert_eq!(p.for_tensor("lm_head.weight"), Q4);
        assert_eq!(
            p.for_tensor("model.multi_modal_projector.image_projection.weight"),
            Fp16
        );
    }
}
