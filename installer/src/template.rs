//! kubexm's own templates (`manifests/templates/`), rendered through one
//! helper that fails on any `{{KEY}}` left unfilled, so a renamed or
//! forgotten placeholder is an error here, never a broken file on a host.
//! Upstream manifests and charts may contain `{{` legitimately and never go
//! through it.
//!
//! A placeholder alone on its line stands for whole lines: its value
//! replaces the line, and an empty value removes it.

/// Shell helpers of the scripts that replace a control-plane node's static
/// pod (`within`, `pod_uid`, `swap_manifest`), filled in where such a script
/// has `{{STATIC_POD}}` alone on a line.
pub const STATIC_POD: &str = include_str!("../../manifests/templates/static-pod.sh");

/// A placeholder left in a rendered template.
#[derive(Debug, thiserror::Error)]
#[error("template {template}: {{{{{key}}}}} was left unfilled; this is a bug in kubexm")]
pub struct Unfilled {
    pub template: String,
    pub key: String,
}

/// Fills `values` into `text` (the template `name`, for the error), in one
/// pass over the template: a value is inserted as it is and never scanned
/// again, so a value holding `{{TOKEN}}` stays that text. Placeholders in
/// `left_for_host` are kept on purpose (filled on the host).
pub fn render(name: &str, text: &str, values: &[(&str, &str)], left_for_host: &[&str]) -> Result<String, Unfilled> {
    let value = |k: &str| values.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
    let unfilled = |key: &str| Unfilled {
        template: name.to_string(),
        key: key.to_string(),
    };
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        let whole = bare
            .strip_prefix("{{")
            .and_then(|b| b.strip_suffix("}}"))
            .filter(|k| is_key(k))
            .and_then(value);
        match whole {
            Some("") => {}
            Some(v) => {
                out.push_str(v.trim_end_matches('\n'));
                if line.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => {
                let mut rest = line;
                while let Some(start) = rest.find("{{") {
                    let after = &rest[start + 2..];
                    match after.find("}}").filter(|end| is_key(&after[..*end])) {
                        Some(end) => {
                            let key = &after[..end];
                            out.push_str(&rest[..start]);
                            match value(key) {
                                Some(v) => out.push_str(v),
                                None if left_for_host.contains(&key) => out.push_str(&rest[start..start + end + 4]),
                                None => return Err(unfilled(key)),
                            }
                            rest = &after[end + 2..];
                        }
                        None => {
                            out.push_str(&rest[..start + 2]);
                            rest = after;
                        }
                    }
                }
                out.push_str(rest);
            }
        }
    }
    Ok(out)
}

/// A placeholder's name: upper case, digits and `_`.
fn is_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
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

    /// Issue 25, item 3: whole-line values were filled before `TOKEN`, so
    /// `{{TOKEN}}` in an eviction threshold became the join token.
    #[test]
    fn a_value_is_never_scanned_for_placeholders() -> Result<(), Unfilled> {
        let t = "{{EXTRA}}\ntoken: {{TOKEN}}\nx: {{A}}\n";
        let out = render(
            "t",
            t,
            &[("EXTRA", "a: \"{{TOKEN}}\""), ("A", "{{TOKEN}}"), ("TOKEN", "secret")],
            &[],
        )?;
        assert_eq!(out, "a: \"{{TOKEN}}\"\ntoken: secret\nx: {{TOKEN}}\n");
        Ok(())
    }

    /// The static-pod helpers, run by sh: `swap_manifest` moves the new
    /// manifest into place (no process of that name running here, so
    /// nothing is stopped or waited for), and `within` fails after its
    /// time with its message.
    #[test]
    fn static_pod_helpers_swap_a_manifest_and_bound_a_wait() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("kubexm-static-pod-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (m, t) = (dir.join("pod.yaml"), dir.join(".pod.yaml.kubexm"));
        std::fs::write(&m, "old\n")?;
        std::fs::write(&t, "new\n")?;
        let script = format!(
            "{STATIC_POD}\nswap_manifest '{}' '{}' kubexm-no-such-command && within 1 'not yet' false",
            m.display(),
            t.display()
        );
        let out = std::process::Command::new("sh").arg("-c").arg(&script).output()?;
        let (swapped, left) = (std::fs::read_to_string(&m)?, t.exists());
        std::fs::remove_dir_all(&dir)?;
        assert_eq!((swapped.as_str(), left), ("new\n", false));
        assert!(!out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stderr), "not yet\n");
        Ok(())
    }
}
