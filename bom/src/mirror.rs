//! Upstream mirrors: rewriting `host[/path]` prefixes to another base URL.
//!
//! One form serves file hosts and registries alike
//! (`dl.k8s.io=https://mirror/k8s`, `registry.k8s.io=https://harbor.local/proxy-k8s`).
//! The longest matching prefix wins, matched on whole path segments.

use crate::image::ImageRef;

/// A set of mirror mappings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mirrors {
    /// (prefix without scheme, base URL without trailing '/'), longest prefix first.
    entries: Vec<(String, String)>,
}

impl Mirrors {
    /// Parses `(prefix, base URL)` pairs; the error names the bad pair.
    pub fn parse<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Mirrors, String> {
        let mut m = Mirrors::default();
        for (from, to) in pairs {
            if from.is_empty() || from.contains("://") {
                return Err(format!(
                    "`{from}`: the upstream side is a host with an optional path, without scheme (dl.k8s.io, github.com/org)"
                ));
            }
            if !(to.starts_with("http://") || to.starts_with("https://")) {
                return Err(format!("`{from}={to}`: the mirror side must be an http:// or https:// base URL"));
            }
            m.entries
                .push((from.trim_end_matches('/').to_string(), to.trim_end_matches('/').to_string()));
        }
        m.sort();
        Ok(m)
    }

    /// Parses `UPSTREAM=URL` command-line values.
    pub fn from_args(args: &[String]) -> Result<Mirrors, String> {
        let pairs = args
            .iter()
            .map(|a| {
                a.split_once('=')
                    .ok_or_else(|| format!("`{a}`: expected UPSTREAM=URL, e.g. dl.k8s.io=https://mirror.example/k8s"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::parse(pairs)
    }

    /// Adds mappings; later ones win over earlier ones for the same prefix.
    pub fn extend(&mut self, other: Mirrors) {
        for (k, v) in other.entries {
            self.entries.retain(|(e, _)| *e != k);
            self.entries.push((k, v));
        }
        self.sort();
    }

    fn sort(&mut self) {
        self.entries.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    pub fn entries(&self) -> Vec<(String, String)> {
        self.entries.clone()
    }

    fn lookup<'a>(&'a self, hostpath: &'a str) -> Option<(&'a str, &'a str)> {
        self.entries.iter().find_map(|(k, v)| {
            let rest = hostpath.strip_prefix(k.as_str())?;
            (rest.is_empty() || rest.starts_with('/') || rest.starts_with(':')).then_some((v.as_str(), rest))
        })
    }

    /// Whether a URL's host has a mapping.
    pub fn covers_url(&self, url: &str) -> bool {
        let hostpath = url.split_once("://").map_or(url, |(_, r)| r);
        self.lookup(hostpath).is_some()
    }

    /// The URL to fetch instead of `url` (itself when no mapping applies).
    pub fn rewrite_url(&self, url: &str) -> String {
        let hostpath = url.split_once("://").map_or(url, |(_, r)| r);
        match self.lookup(hostpath) {
            Some((base, rest)) => format!("{base}{rest}"),
            None => url.to_string(),
        }
    }

    /// Whether a mapping covers an image's registry.
    pub fn covers_image(&self, image: &ImageRef) -> bool {
        self.lookup(&image.to_string()).is_some()
    }

    /// Where to pull an image from when a mapping covers its registry.
    pub fn rewrite_image(&self, image: &ImageRef) -> Option<String> {
        let full = image.to_string();
        self.lookup(&full).map(|(base, rest)| format!("{base}{rest}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_on_segment_boundaries() {
        let m = Mirrors::from_args(&[
            "github.com=https://gh.local".into(),
            "github.com/etcd-io=https://etcd.local/x/".into(),
            "registry.k8s.io=https://harbor.local/proxy-k8s".into(),
        ])
        .unwrap();
        assert_eq!(
            m.rewrite_url("https://github.com/etcd-io/etcd/releases/a.tgz"),
            "https://etcd.local/x/etcd/releases/a.tgz"
        );
        assert_eq!(m.rewrite_url("https://github.com/etcd-iox/a"), "https://gh.local/etcd-iox/a");
        assert_eq!(m.rewrite_url("https://dl.k8s.io/x"), "https://dl.k8s.io/x");
        let pause = ImageRef::parse("registry.k8s.io/pause:3.10").unwrap();
        assert_eq!(
            m.rewrite_image(&pause).as_deref(),
            Some("https://harbor.local/proxy-k8s/pause:3.10")
        );
        assert!(Mirrors::from_args(&["nope".into()]).is_err());
        assert!(Mirrors::from_args(&["https://a=https://b".into()]).is_err());
    }
}
