//! Images named by upstream manifests: every pod template's containers.

/// Every `image:` of `containers`, `initContainers` and `ephemeralContainers`
/// in a multi-document YAML manifest, in document order, without repeats.
pub fn images(text: &str) -> Result<Vec<String>, String> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())?;
    let mut out = Vec::new();
    for d in &docs {
        walk(d, &mut out);
    }
    Ok(out)
}

fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            // Keys in document order (serde_json keeps insertion order here).
            let lists = m
                .iter()
                .filter(|(k, _)| matches!(k.as_str(), "containers" | "initContainers" | "ephemeralContainers"));
            for c in lists.filter_map(|(_, v)| v.as_array()).flatten() {
                if let Some(img) = c.get("image").and_then(|i| i.as_str())
                    && !out.iter().any(|o| o == img)
                {
                    out.push(img.to_string());
                }
            }
            m.values().for_each(|x| walk(x, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_pod_template_images_across_documents() {
        let text = "apiVersion: v1\nkind: ConfigMap\ndata: {image: not-this}\n---\napiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      initContainers:\n        - {name: i, image: docker.io/calico/cni:v3.28.1}\n      containers:\n        - {name: c, image: \"docker.io/calico/node:v3.28.1\"}\n---\nkind: Deployment\nspec: {template: {spec: {containers: [{name: x, image: docker.io/calico/node:v3.28.1}]}}}\n";
        assert_eq!(
            super::images(text).unwrap(),
            ["docker.io/calico/cni:v3.28.1", "docker.io/calico/node:v3.28.1"]
        );
    }
}
