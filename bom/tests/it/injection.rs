//! Issue 25: a config value is data, never code. The JSON schema of the
//! Cluster type (the one the Cluster resource will use) is walked; every
//! string leaf, every array item and every map key and value is fed shell
//! and template payloads. Each is refused with its line:column, or the
//! field is listed in `manifests/config-strings-off-host.yaml` with why it
//! never reaches a host. A new string field that is neither fails here.

use std::collections::BTreeMap;

use kubexm_bom::config::model::Cluster;
use kubexm_bom::config::{LoadError, Origin, load_str_as};
use serde_json::{Map, Value, json};

use crate::{BASE, catalog};

/// The values an attacker would try: shell quoting, command substitution,
/// a newline (one more line in a generated file), a template placeholder
/// the installer fills later, and a sed command.
const PAYLOADS: &[&str] = &[
    "x'; echo pwned > /tmp/kubexm-marker; echo '",
    "x\"; echo pwned > /tmp/kubexm-marker; echo \"",
    "$(echo pwned > /tmp/kubexm-marker)",
    "`echo pwned > /tmp/kubexm-marker`",
    "x\nanonymous: {enabled: true}",
    "{{TOKEN}}",
    "x/;e echo pwned > /tmp/kubexm-marker #",
    // After a valid start: a check that only looks at the prefix, or trims.
    "https://mirror.example/$(echo pwned > /tmp/kubexm-marker)",
    "10.0.0.1\n- 10.0.0.2",
];

/// What the base config lacks: one of every list and map that holds
/// objects, so that each leaf below them has a place.
const RICH: &str = r#"
  loadBalancerService:
    metallb:
      enabled: true
      addressPools:
        - name: default
          addresses: [10.0.0.200-10.0.0.220]
  containerRuntime:
    auths:
      - {registry: r.example, username: u, password: {fromEnv: P}}
"#;

/// Where a string sits in the schema: `a.b[].c`, `a.m{}` (a map's key),
/// `a.m{*}` (a map's value).
fn leaves(schema: &Value) -> Vec<String> {
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    let mut out = Vec::new();
    walk(schema, &defs, String::new(), &mut out, 0);
    out.sort();
    out.dedup();
    out
}

fn resolve<'a>(s: &'a Value, defs: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => resolve(&defs[r.trim_start_matches("#/$defs/")], defs),
        None => s,
    }
}

fn walk(s: &Value, defs: &Value, path: String, out: &mut Vec<String>, depth: usize) {
    assert!(depth < 20, "schema too deep at {path}");
    let s = resolve(s, defs);
    if s.get("enum").is_some() || s.get("const").is_some() {
        return; // a closed set: serde refuses anything else
    }
    for k in ["anyOf", "oneOf", "allOf"] {
        if let Some(v) = s.get(k).and_then(Value::as_array) {
            for alt in v {
                walk(alt, defs, path.clone(), out, depth + 1);
            }
        }
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if types.contains(&"string") {
        out.push(path.clone());
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
            walk(v, defs, p, out, depth + 1);
        }
    }
    if let Some(items) = s.get("items") {
        walk(items, defs, format!("{path}[]"), out, depth + 1);
    }
    if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
        out.push(format!("{path}{{}}"));
        walk(ap, defs, format!("{path}{{*}}"), out, depth + 1);
    }
}

/// One step of a leaf's path.
enum Seg<'a> {
    Field(&'a str),
    Item,
    Key,
    Value,
}

fn segments(leaf: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in leaf.split('.') {
        let name_end = part.find(['[', '{']).unwrap_or(part.len());
        out.push(Seg::Field(&part[..name_end]));
        let mut rest = &part[name_end..];
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("[]") {
                out.push(Seg::Item);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("{*}") {
                out.push(Seg::Value);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("{}") {
                out.push(Seg::Key);
                rest = r;
            } else {
                panic!("cannot read leaf {leaf}");
            }
        }
    }
    out
}

/// `doc` with the leaf set to `v` (objects created on the way, the first
/// item of a list used or made), and the diagnostic path it should name.
fn set(doc: &mut Value, leaf: &str, v: &str) -> String {
    let segs = segments(leaf);
    let mut cur = doc;
    let mut path = String::new();
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        match seg {
            Seg::Field(f) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(f);
                if !cur.is_object() {
                    *cur = Value::Object(Map::new());
                }
                let slot = cur.as_object_mut().unwrap().entry(f.to_string()).or_insert(Value::Null);
                if last {
                    *slot = json!(v);
                    return path;
                }
                cur = slot;
            }
            Seg::Item => {
                path.push_str("[0]");
                if !cur.is_array() || cur.as_array().unwrap().is_empty() {
                    *cur = json!([Value::Null]);
                }
                let slot = &mut cur.as_array_mut().unwrap()[0];
                if last {
                    *slot = json!(v);
                    return path;
                }
                cur = slot;
            }
            Seg::Key => {
                // A map's key: one entry, its value kept from an existing one.
                let value = cur
                    .as_object()
                    .and_then(|m| m.values().next().cloned())
                    .unwrap_or_else(|| json!("1"));
                *cur = json!({ v: value });
                return path;
            }
            Seg::Value => {
                if !cur.is_object() || cur.as_object().unwrap().is_empty() {
                    *cur = json!({ "k": Value::Null });
                }
                let key = cur.as_object().unwrap().keys().next().unwrap().clone();
                path.push('.');
                path.push_str(&key);
                let slot = cur.as_object_mut().unwrap().get_mut(&key).unwrap();
                if last {
                    *slot = json!(v);
                    return path;
                }
                cur = slot;
            }
        }
    }
    path
}

/// Fields listed as never reaching a host, with their reason.
fn off_host() -> BTreeMap<String, String> {
    let text = include_str!("../../../manifests/config-strings-off-host.yaml");
    serde_saphyr::from_str(text).expect("manifests/config-strings-off-host.yaml")
}

#[test]
fn every_string_of_the_cluster_schema_is_refused_or_listed_as_never_on_a_host() {
    let schema = serde_json::to_value(schemars::schema_for!(Cluster)).unwrap();
    let leaves = leaves(&schema);
    assert!(leaves.len() > 40, "the walk found only {leaves:?}");
    let listed = off_host();
    for l in listed.keys() {
        assert!(
            leaves.contains(l),
            "manifests/config-strings-off-host.yaml lists {l}, which the schema has not"
        );
    }
    let catalog = catalog();
    let base: Value = {
        let text = format!("{BASE}{}", RICH.trim_start_matches('\n'));
        load_str_as(&text, "cluster.yaml", Some(&catalog), Origin::Operator).expect("the rich base is valid");
        serde_saphyr::from_str(&text).unwrap()
    };
    let mut failures = Vec::new();
    for leaf in leaves.iter().filter(|l| !listed.contains_key(*l)) {
        for payload in PAYLOADS {
            let mut doc = base.clone();
            let want = set(&mut doc, leaf, payload);
            let text = serde_saphyr::to_string(&doc).unwrap();
            match load_str_as(&text, "cluster.yaml", Some(&catalog), Origin::Operator) {
                Ok(_) => failures.push(format!("{leaf}: {payload:?} was accepted")),
                Err(LoadError::Invalid(d)) => {
                    // At the value itself (a map's key: at the map, or at
                    // the entry); a problem elsewhere does not count.
                    let named = d
                        .diagnostics
                        .iter()
                        .any(|x| x.line.is_some() && (x.path == want || x.path.starts_with(&format!("{want}."))));
                    if !named {
                        failures.push(format!("{leaf}: {payload:?} refused, but not at {want}: {d}"));
                    }
                }
                Err(e) => failures.push(format!("{leaf}: {payload:?}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{} problems:\n{}", failures.len(), failures.join("\n"));
}
