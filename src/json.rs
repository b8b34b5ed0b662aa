//! Strict JSON for files that come from the network (safetensors headers, `config.json`, the shard index,
//! `generation_config.json`, `preprocessor_config.json`): exactly `serde_json::Value` parsing, except that
//! a key repeated in one object is an error naming the key. `serde_json::Value` keeps the last of
//! duplicate keys silently, so `{"w": A, "w": B}` in a safetensors header lost tensor A and surfaced as a
//! misleading "gap in the data section"; two spellings of one config key could disagree unseen.
//! Nesting is bounded by serde_json's recursion limit (128), as for `Value`.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parse `text` as one JSON value, rejecting duplicate keys at any depth. The error message names the
/// duplicated key (`duplicate key "w" ...`) and, like serde_json's, the position.
pub fn parse_strict(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// [`parse_strict`] on bytes (which must be UTF-8).
pub fn parse_strict_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, x: f64) -> Result<Value, E> {
        Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number is not finite"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Strict.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element_seed(Strict)? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(k) = a.next_key::<String>()? {
            if m.contains_key(&k) {
                return Err(de::Error::custom(format_args!("duplicate key {k:?}")));
            }
            let v = a.next_value_seed(Strict)?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_value_parsing_without_duplicates() {
        for text in [
            r#"{"a": [1, -2, 3.5, true, null, "x\u00e9"], "b": {"c": {}}, "d": 18446744073709551615}"#,
            "[]",
            "  7 ",
            r#""s""#,
        ] {
            let want: Value = serde_json::from_str(text).unwrap();
            assert_eq!(parse_strict(text).unwrap(), want, "{text}");
            assert_eq!(parse_strict_slice(text.as_bytes()).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn duplicate_keys_are_named_at_any_depth() {
        for (text, key) in [
            (r#"{"w": 1, "w": 2}"#, "\"w\""),
            (r#"{"a": {"dtype": "F32", "dtype": "F16"}}"#, "\"dtype\""),
            (r#"[{"k": 1}, {"x": 0, "k": 1, "\u006b": 2}]"#, "\"k\""),
        ] {
            let e = parse_strict(text).unwrap_err().to_string();
            assert!(
                e.contains("duplicate key") && e.contains(key),
                "{text}: {e}"
            );
        }
        // What `Value` does: the last one wins, silently.
        let v: Value = serde_json::from_str(r#"{"w": 1, "w": 2}"#).unwrap();
        assert_eq!(v["w"], 2);
    }

    #[test]
    fn trailing_data_and_deep_nesting_are_errors() {
        assert!(parse_strict(r#"{} {}"#).is_err());
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(parse_strict(&deep).is_err());
    }
}
