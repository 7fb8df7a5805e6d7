//! Tool input schemas in the strict form OpenAI's structured outputs (and the Agents SDK's
//! `ensure_strict_json_schema`) accept as they are, so a client never falls back to
//! non-strict tools nor rewrites ours.
//!
//! The rules, applied to every object in a schema (`$defs` included):
//! - `additionalProperties: false` (our argument types reject unknown fields too);
//! - every property is listed in `required`; one the server treats as optional accepts
//!   `null` instead (`type: [T, "null"]`, or an `anyOf` with `{"type": "null"}`), and a
//!   missing one still means the same as `null` for clients that send no value;
//! - no `default`, no `$schema`, no `format` on numbers (`uint32`, `double` are not in the
//!   strict subset), `oneOf` becomes `anyOf`.
//!
//! Free-form maps (an object with `additionalProperties: {…}`) are not allowed: arguments
//! that are maps are lists of `{name, value}` pairs instead (see `EnvVar`).

use serde_json::{json, Map, Value};

/// Rewrite one tool's input schema into the strict form.
pub fn strict(schema: &mut Map<String, Value>) {
    schema.remove("$schema");
    if let Some(Value::Object(defs)) = schema.remove("$defs") {
        inline_refs(schema, &defs, 0);
    }
    strict_node(schema);
}

/// Replace every `{"$ref": "#/$defs/X"}` by X itself (its siblings, such as a description,
/// kept), so no strict checker has to follow references. Our argument types are not
/// recursive; `depth` stops a definition that would be.
fn inline_refs(node: &mut Map<String, Value>, defs: &Map<String, Value>, depth: usize) {
    if depth > 16 {
        return;
    }
    if let Some(Value::String(r)) = node.get("$ref") {
        if let Some(Value::Object(def)) = r.strip_prefix("#/$defs/").and_then(|n| defs.get(n)) {
            let def = def.clone();
            node.remove("$ref");
            for (k, v) in def {
                node.entry(k).or_insert(v);
            }
        }
    }
    for v in node.values_mut() {
        match v {
            Value::Object(child) => inline_refs(child, defs, depth + 1),
            Value::Array(items) => {
                for item in items.iter_mut() {
                    if let Value::Object(child) = item {
                        inline_refs(child, defs, depth + 1);
                    }
                }
            }
            _ => {}
        }
    }
}

fn strict_node(node: &mut Map<String, Value>) {
    node.remove("default");
    if let Some(one_of) = node.remove("oneOf") {
        node.insert("anyOf".into(), one_of);
    }
    let numeric = matches!(
        node.get("type"),
        Some(Value::String(t)) if t == "integer" || t == "number"
    ) || node
        .get("type")
        .and_then(Value::as_array)
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.as_str().is_some_and(|t| t == "integer" || t == "number"))
        });
    if numeric {
        node.remove("format");
    }
    let is_object =
        node.get("type").is_some_and(|t| t == "object") || node.contains_key("properties");
    if is_object {
        node.entry("additionalProperties").or_insert(json!(false));
        node.entry("properties").or_insert(json!({}));
        let required: Vec<String> = node
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(Value::Object(props)) = node.get_mut("properties") {
            for (name, prop) in props.iter_mut() {
                if let Value::Object(p) = prop {
                    if !required.contains(name) {
                        make_nullable(p);
                    }
                }
            }
            let all: Vec<Value> = props.keys().map(|k| json!(k)).collect();
            node.insert("required".into(), Value::Array(all));
        }
    }
    for key in ["properties", "$defs"] {
        if let Some(Value::Object(children)) = node.get_mut(key) {
            for child in children.values_mut() {
                if let Value::Object(c) = child {
                    strict_node(c);
                }
            }
        }
    }
    if let Some(Value::Object(items)) = node.get_mut("items") {
        strict_node(items);
    }
    if let Some(Value::Object(extra)) = node.get_mut("additionalProperties") {
        strict_node(extra);
    }
    for key in ["anyOf", "allOf"] {
        if let Some(Value::Array(branches)) = node.get_mut(key) {
            for b in branches.iter_mut() {
                if let Value::Object(b) = b {
                    strict_node(b);
                }
            }
        }
    }
}

fn accepts_null(node: &Map<String, Value>) -> bool {
    match node.get("type") {
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "null"),
        _ => node
            .get("anyOf")
            .and_then(Value::as_array)
            .is_some_and(|bs| bs.iter().any(|b| b.as_object().is_some_and(accepts_null))),
    }
}

fn make_nullable(node: &mut Map<String, Value>) {
    if accepts_null(node) {
        if let Some(Value::Array(e)) = node.get_mut("enum") {
            if !e.contains(&Value::Null) {
                e.push(Value::Null);
            }
        }
        return;
    }
    match node.get_mut("type") {
        Some(Value::String(t)) => {
            let t = t.clone();
            node.insert("type".into(), json!([t, "null"]));
            if let Some(Value::Array(e)) = node.get_mut("enum") {
                e.push(Value::Null);
            }
        }
        Some(Value::Array(ts)) => ts.push(json!("null")),
        _ => {
            if let Some(Value::Array(bs)) = node.get_mut("anyOf") {
                bs.push(json!({"type": "null"}));
            } else {
                // A `$ref` (or any other shape): wrap it, keeping the description outside.
                let description = node.remove("description");
                let inner = std::mem::take(node);
                node.insert("anyOf".into(), json!([inner, {"type": "null"}]));
                if let Some(d) = description {
                    node.insert("description".into(), d);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict_of(v: Value) -> Value {
        let Value::Object(mut m) = v else {
            panic!("an object schema")
        };
        strict(&mut m);
        Value::Object(m)
    }

    #[test]
    fn optional_properties_become_required_and_nullable() {
        let out = strict_of(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "depth": {"type": ["integer", "null"], "format": "uint32", "minimum": 0, "default": 1},
                "egress": {"$ref": "#/$defs/E", "description": "d"},
            },
            "required": ["path"],
            "$defs": {"E": {"type": "string", "enum": ["a", "b"]}},
        }));
        assert_eq!(
            out,
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "path": {"type": "string"},
                    "depth": {"type": ["integer", "null"], "minimum": 0},
                    "egress": {"type": ["string", "null"], "enum": ["a", "b", null], "description": "d"},
                },
                "required": ["depth", "egress", "path"],
            })
        );
    }

    #[test]
    fn nested_objects_and_empty_inputs_are_closed() {
        let out = strict_of(json!({
            "type": "object",
            "properties": {"env": {"type": "array", "items": {"type": "object",
                "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
        }));
        assert_eq!(out["additionalProperties"], false);
        assert_eq!(out["properties"]["env"]["type"], json!(["array", "null"]));
        assert_eq!(
            out["properties"]["env"]["items"]["additionalProperties"],
            false
        );
        let empty = strict_of(json!({"type": "object", "additionalProperties": false}));
        assert_eq!(
            empty,
            json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false})
        );
    }
}
