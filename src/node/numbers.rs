//! JSON numbers as JS numbers. napi's serializer turns an integer above u32::MAX into a BigInt, so
//! byte counts of a large model (or the CPU backend's "no limit") would change type with their size;
//! every integer becomes an f64 here, exact up to 2^53 (the values the engine reports stay below).

use serde_json::{Number, Value};

/// `v` with every integer as a float.
pub fn js_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) if !n.is_f64() => n
            .as_f64()
            .and_then(Number::from_f64)
            .map_or(Value::Number(n), Value::Number),
        Value::Array(a) => Value::Array(a.into_iter().map(js_numbers).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, js_numbers(v))).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_become_floats_everywhere() {
        let v = js_numbers(serde_json::json!({"a": 1u64 << 40, "b": [7, -2, 0.5], "c": "x"}));
        assert!(v["a"].is_f64() && v["a"].as_f64() == Some((1u64 << 40) as f64));
        assert!(v["b"].as_array().unwrap().iter().all(Value::is_f64));
        assert_eq!(v["c"], "x");
    }
}
