//! The structured-output extractor: finding, extracting and validating JSON
//! in any model answer never panics, and what it extracts is valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlance_core::{extract_json, extract_valid, find_json_values, validate};

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let _ = find_json_values(raw);
    let _ = extract_json(raw);
    let schema = serde_json::json!({
        "type": "object",
        "required": ["name", "score"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "score": {"type": "integer", "minimum": 0, "maximum": 100},
            "tags": {"type": "array", "items": {"type": "string"}},
            "kind": {"enum": ["a", "b"]}
        }
    });
    if let Ok(v) = extract_valid(raw, &schema) {
        assert!(validate(&schema, &v).is_ok(), "extracted {v} is not valid");
    }
});
