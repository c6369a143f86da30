//! Upstream checksum files: `HEX`, `HEX  NAME` or `HEX *NAME` per line.

use kubexm_bundle::digest::is_sha256_hex;

/// The sha256 a checksum file lists for `file_name`. A file holding a single
/// bare digest (dl.k8s.io's `.sha256`) applies to the file it sits beside.
pub fn find(text: &str, file_name: &str) -> Option<String> {
    let mut bare = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let Some(first) = parts.next() else { continue };
        let hex = first.to_ascii_lowercase();
        if !is_sha256_hex(&hex) {
            continue;
        }
        match parts.next() {
            None => bare.push(hex),
            Some(name) => {
                let name = name.trim_start_matches('*').trim_start_matches("./");
                if name == file_name || name.rsplit('/').next() == Some(file_name) {
                    return Some(hex);
                }
            }
        }
    }
    (bare.len() == 1).then(|| bare.remove(0))
}

#[cfg(test)]
mod tests {
    use super::find;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn formats_upstreams_publish() {
        assert_eq!(find(A, "kubeadm").as_deref(), Some(A));
        assert_eq!(find(&format!("{A}\n"), "x").as_deref(), Some(A));
        let sums = format!("{A}  etcd-v3.5.0-linux-amd64.tar.gz\n{B}  etcd-v3.5.0-linux-arm64.tar.gz\n");
        assert_eq!(find(&sums, "etcd-v3.5.0-linux-arm64.tar.gz").as_deref(), Some(B));
        assert_eq!(
            find(&format!("{B} *runc.arm64\n{A} *runc.amd64\n"), "runc.amd64").as_deref(),
            Some(A)
        );
        assert_eq!(find(&sums, "other"), None);
        assert_eq!(find("not a checksum", "x"), None);
    }
}
