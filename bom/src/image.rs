//! Image references, normalized to their full upstream form.
//!
//! kubexm keeps an image's full reference everywhere (the architecture's one
//! naming rule): `nginx` is `docker.io/library/nginx:latest`,
//! `calico/node:v3.28.1` is `docker.io/calico/node:v3.28.1`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The repository of the controller's image (issue 31), which
/// `kubexm-bundle build` makes from its own `kubexm` binary instead of
/// pulling it: no registry serves it but the cluster's own.
pub const CONTROLLER_REPOSITORY: &str = "kubexm.io/kubexm";

/// The controller's image of this release: [`CONTROLLER_REPOSITORY`] tagged
/// with kubexm's version.
pub fn controller_image() -> ImageRef {
    ImageRef {
        registry: "kubexm.io".into(),
        repository: "kubexm".into(),
        tag: Some(env!("CARGO_PKG_VERSION").into()),
        digest: None,
    }
}

impl ImageRef {
    /// The controller's image, of any release: built, never pulled.
    pub fn is_controller(&self) -> bool {
        format!("{}/{}", self.registry, self.repository) == CONTROLLER_REPOSITORY
    }
}

/// A parsed, normalized image reference.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ImageRef {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:...`
    pub digest: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{input}` is not an image reference: {why}")]
pub struct BadImageRef {
    pub input: String,
    pub why: &'static str,
}

impl ImageRef {
    pub fn parse(input: &str) -> Result<ImageRef, BadImageRef> {
        let bad = |why| BadImageRef {
            input: input.to_string(),
            why,
        };
        if input.is_empty() || input.len() > 512 || input.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("it is empty, too long or contains spaces"));
        }
        let (rest, digest) = match input.split_once('@') {
            Some((r, d)) => {
                let hex = d.strip_prefix("sha256:").ok_or_else(|| bad("a digest must start with sha256:"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
                    return Err(bad("a sha256 digest has 64 lowercase hex digits"));
                }
                (r, Some(d.to_string()))
            }
            None => (input, None),
        };
        // A tag follows the last ':' after the last '/'.
        let slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[slash..].rfind(':') {
            Some(i) => (&rest[..slash + i], Some(rest[slash + i + 1..].to_string())),
            None => (rest, None),
        };
        if tag.as_deref().is_some_and(|t| t.is_empty() || t.len() > 128) {
            return Err(bad("the tag is empty or longer than 128 characters"));
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first.to_string(), rest.to_string()),
            _ if name.contains('/') => ("docker.io".to_string(), name.to_string()),
            _ => ("docker.io".to_string(), format!("library/{name}")),
        };
        let valid = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        };
        if !valid(&repository) || repository.split('/').any(str::is_empty) {
            return Err(bad("the repository must be lowercase letters, digits, '.', '_', '-' and '/'"));
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_string())
        } else {
            tag
        };
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The repository with its registry: `registry.k8s.io/pause`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl TryFrom<String> for ImageRef {
    type Error = BadImageRef;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ImageRef::parse(&s)
    }
}

impl From<ImageRef> for String {
    fn from(r: ImageRef) -> String {
        r.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_docker_hub_and_keeps_others() {
        let s = |i: &str| ImageRef::parse(i).unwrap().to_string();
        assert_eq!(s("nginx"), "docker.io/library/nginx:latest");
        assert_eq!(s("calico/node:v3.28.1"), "docker.io/calico/node:v3.28.1");
        assert_eq!(s("registry.k8s.io/pause:3.10"), "registry.k8s.io/pause:3.10");
        assert_eq!(s("localhost:5000/a/b:1"), "localhost:5000/a/b:1");
        assert_eq!(
            s("registry.k8s.io/coredns/coredns:v1.12.0"),
            "registry.k8s.io/coredns/coredns:v1.12.0"
        );
        assert!(ImageRef::parse("Bad/Name").is_err());
        assert!(ImageRef::parse("x@sha256:abc").is_err());
    }
}
