//! Differential bundles: a bundle whose archive holds only the members its
//! base (a full bundle, named by the sha256 of its `bundle.yaml`) lacks.
//!
//! Its `bundle.yaml` lists every member of the full content, the ones the
//! base carries marked `fromBase`, so a reader of the pair sees exactly what
//! a full bundle of the same inputs holds. This module holds the one
//! definition of "taken from the base" (the builder marks with it) and of
//! "this base fits this differential" (every reader checks with it).

use crate::manifest::{Base, BundleManifest, Member};

/// Whether `s` is `sha256:` and 64 lowercase hex digits.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The hex part of a `sha256:<hex>` digest (the base's unpack directory).
pub fn hex(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// The `bundle.yaml` of the full bundle that the bundle `m` (whose own
/// `bundle.yaml` is `text`) stands for: a differential bundle's without its
/// base and its `fromBase` marks, which is byte for byte the one a full
/// build of the same inputs writes; a full bundle's own. Refused when this
/// kubexm writes it otherwise than the builder recorded
/// (`base.contentDigest`): another version's serialization.
pub fn full_text<'a>(m: &BundleManifest, text: &'a str) -> Result<std::borrow::Cow<'a, str>, String> {
    let Some(base) = &m.base else {
        return Ok(std::borrow::Cow::Borrowed(text));
    };
    let mut full = m.clone();
    full.base = None;
    full.members.iter_mut().for_each(|x| x.from_base = false);
    let full = full.to_yaml().map_err(|e| format!("writing the full bundle's bundle.yaml: {e}"))?;
    let digest = format!("sha256:{}", crate::digest::sha256_hex(full.as_bytes()));
    if digest != base.content_digest {
        return Err(format!(
            "it stands for the full bundle {}, but this kubexm writes that bundle.yaml as {digest} (it was built by {}): \
             unpack it with the kubexm version that built it, or carry the full bundle",
            base.content_digest, m.created_by
        ));
    }
    Ok(std::borrow::Cow::Owned(full))
}

/// `sha256:<hex>` of [`full_text`]: the content's id. A bundle unpacks to
/// `bundles/<hex>`, and an install records this digest, so a differential
/// bundle with its base and the full bundle of the same content are the
/// same bundle to everything after the unpack.
pub fn content_digest(m: &BundleManifest, text: &str) -> Result<String, String> {
    Ok(format!("sha256:{}", crate::digest::sha256_hex(full_text(m, text)?.as_bytes())))
}

/// Why a base does not fit a differential bundle. Each names both bundles
/// and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{bundle} is a full bundle, not a differential one (its bundle.yaml names no base); leave --base out")]
    NotDifferential { bundle: String },
    #[error(
        "{bundle} is a differential bundle of base {want}; {base} is {got}, another bundle. Pass the base it was built against (`kubexm-bundle inspect --bundle {bundle}` names it)"
    )]
    OtherBase {
        bundle: String,
        base: String,
        want: String,
        got: String,
    },
    #[error(
        "{base} is itself a differential bundle (of {of}); a differential bundle's base must be a full bundle: chains of differentials are not supported yet"
    )]
    Chain { base: String, of: String },
    #[error(
        "{bundle} takes {member} from its base, but the base {base} {why}: the differential was not built against this base, or was changed"
    )]
    Missing {
        bundle: String,
        base: String,
        /// `path (sha256 <hex>, <n> bytes)`.
        member: String,
        why: String,
    },
}

impl DiffError {
    /// A limit of this release rather than a bad pair.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, DiffError::Chain { .. })
    }
}

/// Checks that `base` (whose `bundle.yaml` has digest `base_digest`) is the
/// full bundle the differential `diff` was built against, and that it holds
/// every member `diff` takes from it with that exact size and sha256.
/// `diff_name` and `base_name` name the two in messages.
pub fn check_base(
    diff: &BundleManifest,
    diff_name: &str,
    base: &BundleManifest,
    base_digest: &str,
    base_name: &str,
) -> Result<(), DiffError> {
    let Some(want) = &diff.base else {
        return Err(DiffError::NotDifferential {
            bundle: diff_name.to_string(),
        });
    };
    if let Some(of) = &base.base {
        return Err(DiffError::Chain {
            base: base_name.to_string(),
            of: of.digest.clone(),
        });
    }
    if want.digest != base_digest {
        return Err(DiffError::OtherBase {
            bundle: diff_name.to_string(),
            base: base_name.to_string(),
            want: want.digest.clone(),
            got: base_digest.to_string(),
        });
    }
    let held: std::collections::HashMap<&str, &Member> = base.members.iter().map(|m| (m.path.as_str(), m)).collect();
    for m in diff.members.iter().filter(|m| m.from_base) {
        let why = match held.get(m.path.as_str()) {
            None => "has no such member".to_string(),
            Some(b) if b.sha256 != m.sha256 || b.size != m.size => {
                format!("holds it with sha256 {} ({} bytes)", b.sha256, b.size)
            }
            Some(_) => continue,
        };
        return Err(DiffError::Missing {
            bundle: diff_name.to_string(),
            base: base_name.to_string(),
            member: format!("{} (sha256 {}, {} bytes)", m.path, m.sha256, m.size),
            why,
        });
    }
    Ok(())
}

/// Makes the full bundle `full` a differential one of `base` (digest
/// `base_digest`): marks each member `base` holds with the same path, size
/// and sha256 as taken from it, and names the base and the full content.
pub fn make_differential(full: &mut BundleManifest, base: &BundleManifest, base_digest: &str) -> Result<(), String> {
    let yaml = full.to_yaml().map_err(|e| format!("writing bundle.yaml: {e}"))?;
    let content_digest = format!("sha256:{}", crate::digest::sha256_hex(yaml.as_bytes()));
    full.base = Some(take_from(&mut full.members, base, base_digest, content_digest));
    Ok(())
}

/// Marks each of `members` that `base` (digest `base_digest`) holds with the
/// same path, size and sha256 as taken from it; returns the [`Base`] the
/// differential's `bundle.yaml` names (`content_digest`: the full bundle's).
fn take_from(members: &mut [Member], base: &BundleManifest, base_digest: &str, content_digest: String) -> Base {
    let held: std::collections::HashSet<(&str, u64, &str)> =
        base.members.iter().map(|m| (m.path.as_str(), m.size, m.sha256.as_str())).collect();
    for m in members.iter_mut() {
        m.from_base = held.contains(&(m.path.as_str(), m.size, m.sha256.as_str()));
    }
    Base {
        digest: base_digest.to_string(),
        created_by: base.created_by.clone(),
        content_digest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::manifest;

    fn member(path: &str, sha: &str) -> Member {
        Member {
            path: path.into(),
            size: 1,
            sha256: sha.into(),
            from_base: false,
        }
    }

    const DIGEST: &str = "sha256:00000000000000000000000000000000000000000000000000000000000000aa";

    #[test]
    fn make_differential_marks_exact_matches_and_check_base_accepts_the_pair() -> Result<(), Box<dyn std::error::Error>> {
        let base = manifest(vec![member("a", "1"), member("b", "2")]);
        let full = manifest(vec![member("a", "1"), member("b", "3"), member("c", "4")]);
        let mut diff = full.clone();
        make_differential(&mut diff, &base, DIGEST)?;
        assert_eq!(diff.members.iter().map(|m| m.from_base).collect::<Vec<_>>(), [true, false, false]);
        check_base(&diff, "new", &base, DIGEST, "old")?;
        let yaml = diff.to_yaml()?;
        assert!(yaml.contains("fromBase: true"), "{yaml}");
        assert_eq!(BundleManifest::from_yaml(&yaml)?, diff);
        assert_eq!(diff.carried_size(), 2);
        assert_eq!(diff.total_size(), 3);
        // The content's id is the full bundle's.
        let full_yaml = full.to_yaml()?;
        assert_eq!(full_text(&diff, &yaml)?, full_yaml);
        assert_eq!(content_digest(&diff, &yaml)?, content_digest(&full, &full_yaml)?);
        assert_eq!(
            content_digest(&full, &full_yaml)?,
            format!("sha256:{}", crate::digest::sha256_hex(full_yaml.as_bytes()))
        );
        // A reader that writes the full bundle.yaml otherwise refuses.
        let mut other = diff.clone();
        other.base.as_mut().ok_or("no base")?.content_digest = DIGEST.into();
        let e = content_digest(&other, &other.to_yaml()?).unwrap_err();
        assert!(e.contains("kubexm version that built it"), "{e}");
        Ok(())
    }

    #[test]
    fn check_base_refuses_another_base_a_chain_a_missing_member_and_a_full_bundle() -> Result<(), Box<dyn std::error::Error>> {
        let base = manifest(vec![member("a", "1")]);
        let mut diff = manifest(vec![member("a", "1")]);
        let e = check_base(&diff, "new", &base, DIGEST, "old").unwrap_err();
        assert!(matches!(e, DiffError::NotDifferential { .. }), "{e}");
        make_differential(&mut diff, &base, DIGEST)?;
        let other = DIGEST.replace("aa", "bb");
        let e = check_base(&diff, "new", &base, &other, "old").unwrap_err();
        assert!(e.to_string().contains(DIGEST) && e.to_string().contains(&other), "{e}");
        let mut chained = base.clone();
        chained.base = diff.base.clone();
        let e = check_base(&diff, "new", &chained, DIGEST, "old").unwrap_err();
        assert!(e.is_unsupported() && e.to_string().contains("not supported yet"), "{e}");
        let changed = manifest(vec![member("a", "9")]);
        let e = check_base(&diff, "new", &changed, DIGEST, "old").unwrap_err();
        assert!(
            e.to_string().contains("takes a (sha256 1") && e.to_string().contains("holds it with sha256 9"),
            "{e}"
        );
        let empty = manifest(vec![]);
        let e = check_base(&diff, "new", &empty, DIGEST, "old").unwrap_err();
        assert!(e.to_string().contains("has no such member"), "{e}");
        Ok(())
    }

    #[test]
    fn a_manifest_marking_members_from_base_without_a_base_or_listing_one_twice_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let twice = manifest(vec![member("a", "1"), member("a", "1")]);
        let e = BundleManifest::from_yaml(&twice.to_yaml()?).unwrap_err();
        assert!(e.contains("listed twice"), "{e}");
        let mut m = manifest(vec![member("a", "1")]);
        m.members[0].from_base = true;
        let e = BundleManifest::from_yaml(&m.to_yaml()?).unwrap_err();
        assert!(e.contains("no base is named"), "{e}");
        m.base = Some(Base {
            digest: "sha256:xyz".into(),
            created_by: "t".into(),
            content_digest: DIGEST.into(),
        });
        let e = BundleManifest::from_yaml(&m.to_yaml()?).unwrap_err();
        assert!(e.contains("not sha256:"), "{e}");
        Ok(())
    }
}
