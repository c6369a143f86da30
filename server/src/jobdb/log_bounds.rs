//! A job's stored log, bounded. Its lines come from hosts (a step's output)
//! and a host may print without end; one job database serves every
//! cluster's jobs. So each stored line is at most [`MAX_LINE`] bytes and a
//! job keeps at most [`MAX_LINES`] lines (about 50 MiB), each cut said in
//! the log itself. The job's status and error are stored whatever the log.

use std::borrow::Cow;

/// Bytes of one stored line (after its control characters are escaped).
pub const MAX_LINE: usize = 1024;

/// Lines stored for one job, the line saying the cap was reached included.
pub const MAX_LINES: i64 = 50_000;

/// `l` as stored: control characters escaped ([`crate::text::line`]), cut
/// to [`MAX_LINE`] bytes on a character boundary with the cut said.
pub fn line(l: &str) -> String {
    // A cut before escaping, so a megabyte line is never escaped whole.
    let raw = &l[..floor_char_boundary(l, MAX_LINE)];
    let escaped = crate::text::line(raw);
    if raw.len() == l.len() && escaped.len() <= MAX_LINE {
        return escaped.into_owned();
    }
    let mut out = escaped[..floor_char_boundary(&escaped, MAX_LINE)].to_string();
    out.push_str(&format!(" [kubexm: a line of {} bytes, cut to {MAX_LINE}]", l.len()));
    out
}

/// Of `lines` to store after `stored` lines of the job: all while under the
/// cap; at the cap as many as fit before one line saying the rest are not
/// stored; none once that line is stored.
pub fn capped(stored: i64, lines: &[String]) -> Vec<Cow<'_, str>> {
    let room = usize::try_from(MAX_LINES - stored).unwrap_or(0);
    if lines.len() < room {
        return lines.iter().map(|l| Cow::Borrowed(l.as_str())).collect();
    }
    if room == 0 {
        return Vec::new();
    }
    let mut out: Vec<Cow<str>> = lines[..room - 1].iter().map(|l| Cow::Borrowed(l.as_str())).collect();
    out.push(Cow::Owned(format!(
        "[kubexm: this job's log reached its cap of {MAX_LINES} lines; later lines are not stored (its status and error still are)]"
    )));
    out
}

fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_cut_on_a_character_boundary_with_the_cut_said() {
        assert_eq!(line("short\ttext"), "short\ttext");
        let long = "é".repeat(MAX_LINE);
        let cut = line(&long);
        assert!(cut.starts_with(&"é".repeat(MAX_LINE / 2)), "{cut}");
        assert!(cut.ends_with(&format!(" [kubexm: a line of {} bytes, cut to {MAX_LINE}]", 2 * MAX_LINE)));
        assert!(cut.len() <= MAX_LINE + 60);
        // Escaping can make a line longer than the cap: cut after it too.
        let nuls = "\0".repeat(MAX_LINE - 10);
        let cut = line(&nuls);
        assert!(cut.len() <= MAX_LINE + 60 && cut.starts_with("\\u{0}"), "{cut}");
        assert!(cut.contains("[kubexm: a line of"), "{cut}");
    }

    #[test]
    fn a_job_stores_at_most_its_cap_of_lines_with_the_cap_said() {
        let lines: Vec<String> = (0..10).map(|i| format!("l{i}")).collect();
        assert_eq!(capped(0, &lines).len(), 10);
        assert_eq!(capped(MAX_LINES - 11, &lines).len(), 10);
        let at_cap = capped(MAX_LINES - 10, &lines);
        assert_eq!(at_cap.len(), 10);
        assert_eq!(at_cap[8], "l8");
        assert!(at_cap[9].contains("reached its cap"), "{at_cap:?}");
        let near = capped(MAX_LINES - 3, &lines);
        assert_eq!(near.len(), 3);
        assert!(near[2].contains("reached its cap"));
        assert!(capped(MAX_LINES, &lines).is_empty());
        assert!(capped(MAX_LINES + 5, &lines).is_empty());
    }
}
