//! Reading the JUnit report `e2e.test` writes (`junit_01.xml`, Ginkgo v2's
//! reporter): one `<testcase>` per spec of the suite, each with a `status`
//! attribute (passed, failed, skipped, pending, panicked, timedout,
//! interrupted, aborted) and its time in seconds. Only the attributes of
//! `<testcase>` are read; the report is the tests' own output, so a
//! malformed one is an error naming the file, never a panic.

/// One spec's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub name: String,
    /// One of the suite's own nodes (before and after the specs), not a spec.
    pub suite: bool,
    pub status: Status,
    pub seconds: f64,
    /// Why it failed: the `message` of its `<failure>` or `<error>`.
    pub message: Option<String>,
}

/// A spec's outcome, as the report gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed,
    Skipped,
}

/// Every `<testcase>` of `xml`, in order.
pub fn cases(xml: &str) -> Result<Vec<Case>, String> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(at) = rest.find("<testcase") {
        rest = &rest[at + "<testcase".len()..];
        let end = tag_end(rest).ok_or("a <testcase> tag is not closed")?;
        let attrs = attributes(&rest[..end])?;
        let get = |k: &str| attrs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let raw = get("name").ok_or("a <testcase> has no name")?;
        let (name, suite) = (spec_name(raw), suite_node(raw));
        let status = match get("status") {
            Some("passed") => Status::Passed,
            Some("skipped" | "pending") => Status::Skipped,
            Some(_) => Status::Failed,
            // Reporters without a status attribute: a <failure> or
            // <skipped> child says it.
            None => child_status(&rest[end..]),
        };
        let seconds = get("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        let message = match status {
            Status::Failed => failure_message(&rest[end..]),
            _ => None,
        };
        out.push(Case {
            name,
            suite,
            status,
            seconds,
            message,
        });
        rest = &rest[end..];
    }
    Ok(out)
}

/// A case's spec name: Ginkgo v2 puts the node type first (`[It] [sig-node]
/// Pods ...`); the spec name (conformance.yaml's codename) follows it.
fn spec_name(name: &str) -> String {
    name.strip_prefix("[It] ").unwrap_or(name).to_string()
}

/// Whether a case is one of the suite's own nodes (`[SynchronizedBeforeSuite]`,
/// `[ReportAfterSuite] ...`: one per parallel process), not a spec.
fn suite_node(name: &str) -> bool {
    [
        "[ReportBeforeSuite]",
        "[ReportAfterSuite]",
        "[BeforeSuite]",
        "[AfterSuite]",
        "[SynchronizedBeforeSuite]",
        "[SynchronizedAfterSuite]",
        "[DeferCleanup (Suite)]",
    ]
    .iter()
    .any(|n| name.starts_with(n))
}

/// The outcome from the children of a `<testcase>` that has no status.
fn child_status(after: &str) -> Status {
    let body = match (after.starts_with("/>"), after.find("</testcase>")) {
        (true, _) | (false, None) => "",
        (false, Some(e)) => &after[..e],
    };
    if body.contains("<failure") || body.contains("<error") {
        Status::Failed
    } else if body.contains("<skipped") {
        Status::Skipped
    } else {
        Status::Passed
    }
}

/// The `message` attribute of the first `<failure>` or `<error>` among the
/// children of the `<testcase>` whose tag ends `after` starts.
fn failure_message(after: &str) -> Option<String> {
    let body = &after[..after.find("</testcase>")?];
    let at = ["<failure", "<error"]
        .iter()
        .filter_map(|t| body.find(t).map(|i| i + t.len()))
        .min()?;
    let tag = &body[at..];
    let attrs = attributes(&tag[..tag_end(tag)?]).ok()?;
    attrs
        .into_iter()
        .find(|(n, _)| n == "message")
        .map(|(_, v)| v)
        .filter(|m| !m.trim().is_empty())
}

/// Where the tag whose attributes start `s` ends (at its `>` or `/>`),
/// outside quoted values.
fn tag_end(s: &str) -> Option<usize> {
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '>') => return Some(if s[..i].ends_with('/') { i - 1 } else { i }),
            _ => {}
        }
    }
    None
}

/// `name="value"` pairs, values unescaped.
fn attributes(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("an attribute without a value near {:?}", clip(rest)))?;
        let name = rest[..eq].trim().to_string();
        let after = rest[eq + 1..].trim_start();
        let q = after.chars().next().filter(|c| *c == '"' || *c == '\'');
        let q = q.ok_or_else(|| format!("attribute {name} is not quoted"))?;
        let close = after[1..].find(q).ok_or_else(|| format!("attribute {name} is not closed"))?;
        out.push((name, unescape(&after[1..1 + close])));
        rest = after[close + 2..].trim_start();
    }
    Ok(out)
}

/// XML's five entities and numeric references.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(semi) = rest.find(';') else { break };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn clip(s: &str) -> &str {
    s.char_indices().nth(40).map_or(s, |(i, _)| &s[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ginkgo_v2_cases_with_status_attributes_and_escapes() -> Result<(), String> {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
  <testsuites tests="3" disabled="0" errors="0" failures="1" time="12.5">
      <testsuite name="Kubernetes e2e suite" package="/" tests="3">
          <testcase name="[sig-node] Probing container should be restarted with a exec &#34;cat /tmp/health&#34; liveness probe [Conformance]" classname="Kubernetes e2e suite" status="passed" time="7.25">
              <system-err>a &lt; b</system-err>
          </testcase>
          <testcase name="[sig-network] DNS should provide DNS for the cluster [Conformance]" classname="Kubernetes e2e suite" status="failed" time="3.5">
              <failure message="timed out &amp; gave up" type="failed">...</failure>
          </testcase>
          <testcase name="[sig-storage] a spec not focused" classname="Kubernetes e2e suite" status="skipped" time="0"/>
      </testsuite>
  </testsuites>"#;
        let c = cases(xml)?;
        assert_eq!(c.len(), 3);
        assert_eq!(
            c[0].name,
            r#"[sig-node] Probing container should be restarted with a exec "cat /tmp/health" liveness probe [Conformance]"#
        );
        assert_eq!((c[0].status, c[0].seconds), (Status::Passed, 7.25));
        assert_eq!(c[1].status, Status::Failed);
        assert_eq!(c[1].message.as_deref(), Some("timed out & gave up"));
        assert_eq!((c[0].message.as_deref(), c[2].message.as_deref()), (None, None));
        assert_eq!(c[2].status, Status::Skipped);
        Ok(())
    }

    #[test]
    fn the_node_type_ginkgo_puts_first_is_not_part_of_the_name() -> Result<(), String> {
        let xml = r#"<testcase name="[It] [sig-node] Pods should get a host IP [Conformance] [NodeConformance]" status="passed" time="2"></testcase>"#;
        assert_eq!(
            cases(xml)?[0].name,
            "[sig-node] Pods should get a host IP [Conformance] [NodeConformance]"
        );
        Ok(())
    }

    #[test]
    fn the_suites_own_nodes_are_not_specs() -> Result<(), String> {
        let xml = r#"<testcase name="[SynchronizedBeforeSuite]" status="passed"></testcase>
            <testcase name="[It] [sig-network] HostPort validates [Conformance]" status="passed"></testcase>
            <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" status="passed"></testcase>"#;
        let c: Vec<(String, bool)> = cases(xml)?.into_iter().map(|c| (c.name, c.suite)).collect();
        assert_eq!(
            c,
            [
                ("[SynchronizedBeforeSuite]".to_string(), true),
                ("[sig-network] HostPort validates [Conformance]".to_string(), false),
                ("[ReportAfterSuite] Kubernetes e2e suite report".to_string(), true)
            ]
        );
        Ok(())
    }

    #[test]
    fn cases_without_a_status_read_their_children() -> Result<(), String> {
        let xml =
            r#"<testcase name="a" time="1"></testcase><testcase name="b"><failure/></testcase><testcase name='c'><skipped/></testcase>"#;
        let s: Vec<_> = cases(xml)?.into_iter().map(|c| c.status).collect();
        assert_eq!(s, [Status::Passed, Status::Failed, Status::Skipped]);
        Ok(())
    }

    #[test]
    fn a_broken_report_is_an_error_not_a_panic() {
        for xml in [
            r#"<testcase name="a"#,
            r#"<testcase name=a>"#,
            r#"<testcase time="1">"#,
            "<testcase name=\"\u{e9}",
        ] {
            assert!(cases(xml).is_err(), "{xml}");
        }
    }
}
