//! kubexm's own templates (`manifests/templates/`), rendered through one
//! helper that fails on any `{{KEY}}` left unfilled, so a renamed or
//! forgotten placeholder is an error here, never a broken file on a host.
//! Upstream manifests and charts may contain `{{` legitimately and never go
//! through it.
//!
//! A placeholder alone on its line stands for whole lines: its value
//! replaces the line, and an empty value removes it.

/// A placeholder left in a rendered template.
#[derive(Debug, thiserror::Error)]
#[error("template {template}: {{{{{key}}}}} was left unfilled; this is a bug in kubexm")]
pub struct Unfilled {
    pub template: String,
    pub key: String,
}

/// Fills `values` into `text` (the template `name`, for the error).
/// Placeholders in `left_for_host` are kept on purpose (filled on the host).
pub fn render(name: &str, text: &str, values: &[(&str, &str)], left_for_host: &[&str]) -> Result<String, Unfilled> {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        let whole = values
            .iter()
            .find(|(k, _)| bare.len() == k.len() + 4 && bare == format!("{{{{{k}}}}}"));
        match whole {
            Some((_, "")) => {}
            Some((_, v)) => {
                out.push_str(v.trim_end_matches('\n'));
                if line.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => out.push_str(line),
        }
    }
    for (k, v) in values {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
    if let Some(key) = placeholders(&out).into_iter().find(|k| !left_for_host.contains(&k.as_str())) {
        return Err(Unfilled {
            template: name.to_string(),
            key,
        });
    }
    Ok(out)
}

/// Every `{{KEY}}` (upper case, digits, `_`) in `text`.
fn placeholders(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        match after.find("}}") {
            Some(end)
                if end > 0
                    && after[..end]
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
            {
                found.push(after[..end].to_string());
                rest = &after[end + 2..];
            }
            _ => rest = after,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_inline_and_whole_line_placeholders() -> Result<(), Unfilled> {
        let t = "a: {{A}}\n{{LINES}}\nb: {{B}}\n{{GONE}}\nend\n";
        let out = render("t", t, &[("A", "1"), ("B", "2"), ("LINES", "x: 1\ny: 2\n"), ("GONE", "")], &[])?;
        assert_eq!(out, "a: 1\nx: 1\ny: 2\nb: 2\nend\n");
        Ok(())
    }

    #[test]
    fn an_unfilled_placeholder_is_an_error_naming_it() {
        let err = render("kubeadm/init", "a: {{A}}\nb: {{TYPO}}\n", &[("A", "1")], &[]);
        assert!(matches!(&err, Err(Unfilled { key, .. }) if key == "TYPO"), "{err:?}");
        // One kept on purpose for the host is not.
        assert!(render("keepalived", "i: {{INTERFACE}}\n", &[], &["INTERFACE"]).is_ok());
        // Braces that are not a placeholder (Go templates, shell) pass.
        assert!(render("x", "{{ .Values.x }} ${{a}}\n", &[], &[]).is_ok());
    }
}
