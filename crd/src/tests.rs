//! The definition against the committed file, the model, and what a real
//! API server requires of a structural schema.

use super::*;

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Calls `f` on every schema node under `schema` (properties' values,
/// items, nested objects), with its path.
fn walk(schema: &Value, path: &str, f: &mut impl FnMut(&str, &serde_json::Map<String, Value>)) {
    let Some(obj) = schema.as_object() else { return };
    f(path, obj);
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, p) in props {
            walk(p, &format!("{path}.{name}"), f);
        }
    }
    if let Some(items) = obj.get("items") {
        walk(items, &format!("{path}[]"), f);
    }
    if let Some(extra @ Value::Object(_)) = obj.get("additionalProperties") {
        walk(extra, &format!("{path}{{}}"), f);
    }
}

/// The committed definition is what the model generates. To change it,
/// change the model and regenerate (`KUBEXM_BLESS=1`), then review the diff.
#[test]
fn the_committed_definition_is_what_the_model_generates() -> Result<(), Box<dyn std::error::Error>> {
    let want = yaml()?;
    let file = repo().join(CRD_FILE);
    if std::env::var_os("KUBEXM_BLESS").is_some() {
        std::fs::write(&file, &want)?;
    }
    let have = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        have == want,
        "{CRD_FILE} is not what the model generates: run KUBEXM_BLESS=1 cargo test -p kubexm-crd, review the diff and commit it"
    );
    Ok(())
}

/// Structural, as the API server requires: every node has a type (or keeps
/// unknown fields), no references or alternatives, no defaults.
#[test]
fn the_schema_is_structural_and_has_no_defaults() -> Result<(), CrdError> {
    let crd = definition()?;
    let schema = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema")
        .ok_or_else(|| CrdError::Missing("schema".into()))?;
    let mut bad = Vec::new();
    walk(schema, "", &mut |path, node| {
        if !node.contains_key("type") && !node.contains_key("x-kubernetes-preserve-unknown-fields") && !path.is_empty() {
            bad.push(format!("{path}: no type"));
        }
        if node.get("format").and_then(Value::as_str).is_some_and(|f| f.starts_with("uint")) {
            bad.push(format!("{path}: a format the API server does not know"));
        }
        for key in ["$ref", "oneOf", "anyOf", "allOf", "not", "default", "additionalProperties"] {
            if key == "additionalProperties" && !matches!(node.get(key), Some(Value::Bool(_))) {
                continue;
            }
            if node.contains_key(key) {
                bad.push(format!("{path}: {key}"));
            }
        }
    });
    assert!(bad.is_empty(), "not structural:\n{}", bad.join("\n"));
    Ok(())
}

/// No field of the spec names a file, a variable or the SSH agent: a host
/// logs in by credential only, and a secret's reference has no way in.
#[test]
fn no_field_names_a_file_a_variable_or_the_agent() -> Result<(), CrdError> {
    let crd = definition()?;
    let spec = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
        .ok_or_else(|| CrdError::Missing("spec".into()))?;
    let mut seen = Vec::new();
    let mut auths = Vec::new();
    walk(spec, "spec", &mut |path, node| {
        let last = path.rsplit('.').next().unwrap_or_default();
        if [
            "fromFile",
            "fromEnv",
            "privateKey",
            "agent",
            "password",
            "passphrase",
            "caFile",
            "certFile",
            "keyFile",
        ]
        .contains(&last)
        {
            seen.push(path.to_string());
        }
        if last == "auth" {
            let props: Vec<&String> = node
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().collect())
                .unwrap_or_default();
            auths.push(format!("{path}: {props:?}"));
        }
    });
    assert!(seen.is_empty(), "fields naming something off the cluster: {seen:?}");
    assert_eq!(
        auths,
        [
            "spec.hostDefaults.auth: [\"credential\"]",
            "spec.hostDefaults.bastion.auth: [\"credential\"]",
            "spec.hosts[].auth: [\"credential\"]",
            "spec.hosts[].bastion.auth: [\"credential\"]",
        ]
    );
    Ok(())
}

/// A cluster.yaml's spec is a Cluster object's spec, and back: the object
/// carries the body as it was written.
#[test]
fn a_cluster_yaml_spec_is_the_objects_spec() -> Result<(), Box<dyn std::error::Error>> {
    let text = "spec:\n  hosts:\n    - {name: lab1, address: 198.18.0.11, auth: {credential: lab}}\n  \
                roleGroups: {etcd: [lab1], control-plane: [lab1], worker: [lab1]}\n  \
                kubernetes: {version: v1.37.2}\n";
    let cluster: kubexm_bom::config::model::Cluster = serde_saphyr::from_str(text)?;
    let object = ClusterResource::new(
        "lab",
        ClusterSpec {
            cluster: cluster.spec.clone(),
        },
    );
    let json = serde_json::to_value(&object)?;
    assert_eq!(json["apiVersion"], "kubexm.io/v1alpha1");
    assert_eq!(json["kind"], "Cluster");
    assert_eq!(json["spec"]["hosts"][0]["auth"]["credential"], "lab");
    assert_eq!(json["spec"]["roleGroups"]["control-plane"][0], "lab1");
    let back: ClusterResource = serde_json::from_value(json)?;
    assert_eq!(back.spec.cluster, cluster.spec);
    Ok(())
}

/// The object's spec names no login and nothing off the cluster, also where
/// a cleared field is required in the model (external etcd's files).
#[test]
fn the_objects_spec_carries_no_login_and_no_file() -> Result<(), Box<dyn std::error::Error>> {
    let text = "spec:\n  hostDefaults: {auth: {privateKey: {path: /root/.ssh/id}}}\n  \
                hosts:\n    - {name: a, address: 10.0.0.1, auth: {credential: lab}, bastion: {address: b, auth: {agent: true}}}\n  \
                etcd: {external: {endpoints: [\"https://e:2379\"], caFile: /ca, certFile: /c, keyFile: /k}}\n  \
                registry: {password: {fromEnv: PW}, caFile: /ca}\n";
    let cluster: kubexm_bom::config::model::Cluster = serde_saphyr::from_str(text)?;
    let spec = in_cluster(&cluster.spec)?;
    let json = spec.to_string();
    for word in [
        "auth",
        "privateKey",
        "credential",
        "agent",
        "caFile",
        "certFile",
        "keyFile",
        "password",
        "fromEnv",
    ] {
        assert!(!json.contains(&format!("\"{word}\"")), "{word} in {json}");
    }
    assert_eq!(spec["etcd"]["external"]["endpoints"][0], "https://e:2379");
    assert_eq!(spec["hosts"][0]["bastion"]["address"], "b");
    Ok(())
}
