//! Debian package repositories for `bundle.osPackages`, without apt: the
//! mirror's `InRelease` is checked against the release's archive keys, the
//! `Packages` index against the hash `InRelease` lists, dependencies are
//! resolved down to the release's base set, every `.deb` is fetched against
//! the index's SHA256, and a flat repository (`Packages`, `Packages.gz`,
//! `Release`) is written per release and arch.
//!
//! OpenPGP is rPGP (the `pgp` crate): pure Rust, so the builder needs no gpg
//! or C library on whatever Linux it runs, maintained, and it reads the RSA
//! and EdDSA keys Debian signs with.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::Write as _;

use kubexm_bom::{DebItem, OsRepoItem};
use pgp::composed::{CleartextSignedMessage, Deserializable, SignedPublicKey};

use super::FetchError;
use super::http::Http;
use crate::cache::Cache;

/// One paragraph of a deb822 file, fields in their order.
#[derive(Debug, Clone, Default)]
pub struct Paragraph {
    fields: Vec<(String, String)>,
}

impl Paragraph {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    fn set(&mut self, key: &str, value: String) {
        match self.fields.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case(key)) {
            Some(f) => f.1 = value,
            None => self.fields.push((key.to_string(), value)),
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.fields {
            out.push_str(k);
            out.push(':');
            if !v.starts_with('\n') {
                out.push(' ');
            }
            out.push_str(v);
            out.push('\n');
        }
        out
    }
}

/// Paragraphs of a deb822 text (Release, Packages). Continuation lines stay
/// part of their field's value.
pub fn paragraphs(text: &str) -> Vec<Paragraph> {
    let mut out = Vec::new();
    let mut cur = Paragraph::default();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !cur.fields.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
        } else if line.starts_with([' ', '\t']) {
            if let Some(last) = cur.fields.last_mut() {
                last.1.push('\n');
                last.1.push_str(line);
            }
        } else if let Some((k, v)) = line.split_once(':') {
            cur.fields.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    if !cur.fields.is_empty() {
        out.push(cur);
    }
    out
}

/// Why a repository could not be built. Each names the release, arch or URL.
#[derive(Debug, thiserror::Error)]
pub enum DebianError {
    #[error("{url}: the OpenPGP signature does not verify against the {release} archive keys ({why}); the mirror or the keyring is wrong")]
    BadSignature { url: String, release: String, why: String },
    #[error("{release}: archive keyring: {why}")]
    Keyring { release: String, why: String },
    #[error("{url}: {why}")]
    BadIndex { url: String, why: String },
    #[error("{url}: sha256 {actual} differs from {expected}, which the signed InRelease lists; nothing was kept")]
    IndexDigest { url: String, expected: String, actual: String },
    #[error("{release} {arch}: {} package(s) cannot be resolved:\n  {}", .0.len(), .0.join("\n  "), release = .1, arch = .2)]
    Unresolvable(Vec<String>, String, String),
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

/// Reads the archive keys from an armored keyring (text before the armor is ignored).
pub fn keyring(release: &str, armored: &str) -> Result<Vec<SignedPublicKey>, DebianError> {
    let bad = |why: String| DebianError::Keyring {
        release: release.into(),
        why,
    };
    let start = armored.find("-----BEGIN").ok_or_else(|| bad("no armored key block".into()))?;
    let (keys, _) = SignedPublicKey::from_armor_many(&armored.as_bytes()[start..]).map_err(|e| bad(e.to_string()))?;
    let keys: Vec<SignedPublicKey> = keys.collect::<Result<_, _>>().map_err(|e| bad(e.to_string()))?;
    if keys.is_empty() {
        return Err(bad("no keys in the keyring".into()));
    }
    Ok(keys)
}

/// Checks a cleartext-signed `InRelease` against `keys` (primary keys and
/// subkeys); returns the signed text.
pub fn verify_inrelease(url: &str, release: &str, text: &str, keys: &[SignedPublicKey]) -> Result<String, DebianError> {
    let bad = |why: String| DebianError::BadSignature {
        url: url.into(),
        release: release.into(),
        why,
    };
    let (msg, _) = CleartextSignedMessage::from_string(text).map_err(|e| bad(format!("not a signed message: {e}")))?;
    let verified = keys
        .iter()
        .any(|k| msg.verify(&k.primary_key).is_ok() || k.public_subkeys.iter().any(|s| msg.verify(&s.key).is_ok()));
    if !verified {
        return Err(bad("no signature made by these keys verifies".into()));
    }
    Ok(msg.signed_text().replace("\r\n", "\n"))
}

/// The SHA256 section of a Release text: path → (sha256, size).
pub fn release_hashes(release: &str) -> HashMap<String, (String, u64)> {
    let mut out = HashMap::new();
    for p in paragraphs(release) {
        if let Some(v) = p.get("SHA256") {
            for line in v.lines() {
                let parts: Vec<&str> = line.split_whitespace().collect();
                if let [sha, size, path] = parts[..] {
                    out.insert(path.to_string(), (sha.to_ascii_lowercase(), size.parse().unwrap_or(0)));
                }
            }
        }
    }
    out
}

/// Orders Debian versions as dpkg does: epoch, then upstream version, then revision.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn split(v: &str) -> (u64, &str, &str) {
        let (epoch, rest) = match v.split_once(':') {
            Some((e, r)) if e.bytes().all(|c| c.is_ascii_digit()) => (e.parse().unwrap_or(0), r),
            _ => (0, v),
        };
        match rest.rsplit_once('-') {
            Some((u, r)) => (epoch, u, r),
            None => (epoch, rest, ""),
        }
    }
    fn order(c: Option<u8>) -> i32 {
        match c {
            Some(b'~') => -1,
            None => 0,
            Some(c) if c.is_ascii_alphabetic() => c as i32,
            Some(c) => c as i32 + 256,
        }
    }
    fn part(a: &str, b: &str) -> Ordering {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            // Non-digit prefixes, character by character.
            while (i < a.len() && !a[i].is_ascii_digit()) || (j < b.len() && !b[j].is_ascii_digit()) {
                let ca = a.get(i).copied().filter(|c| !c.is_ascii_digit());
                let cb = b.get(j).copied().filter(|c| !c.is_ascii_digit());
                let o = order(ca).cmp(&order(cb));
                if o != Ordering::Equal {
                    return o;
                }
                if ca.is_some() {
                    i += 1;
                }
                if cb.is_some() {
                    j += 1;
                }
            }
            // Digit runs, numerically.
            let si = i;
            while i < a.len() && a[i].is_ascii_digit() {
                i += 1;
            }
            let sj = j;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let na = std::str::from_utf8(&a[si..i]).unwrap_or("0").trim_start_matches('0');
            let nb = std::str::from_utf8(&b[sj..j]).unwrap_or("0").trim_start_matches('0');
            let o = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb).then_with(|| part(ua, ub)).then_with(|| part(ra, rb))
}

/// A dependency on one package: name, and an optional `(op version)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Relation {
    name: String,
    constraint: Option<(String, String)>,
}

impl Relation {
    fn parse(s: &str) -> Option<Relation> {
        // Drop arch restrictions `[...]` and build profiles `<...>`.
        let s = s.split(['[', '<']).next().unwrap_or(s).trim();
        let (name, constraint) = match s.split_once('(') {
            Some((n, c)) => {
                let c = c.trim_end_matches(')').trim();
                let op_len = c.find(|ch: char| !"<>=".contains(ch)).unwrap_or(c.len());
                (n.trim(), Some((c[..op_len].to_string(), c[op_len..].trim().to_string())))
            }
            None => (s, None),
        };
        let name = name.split(':').next().unwrap_or(name).trim();
        (!name.is_empty()).then(|| Relation {
            name: name.to_string(),
            constraint,
        })
    }

    fn allows(&self, version: Option<&str>) -> bool {
        let Some((op, want)) = &self.constraint else { return true };
        let Some(v) = version else { return false };
        let o = compare_versions(v, want);
        match op.as_str() {
            "<<" | "<" => o == Ordering::Less,
            "<=" => o != Ordering::Greater,
            "=" => o == Ordering::Equal,
            ">=" => o != Ordering::Less,
            ">>" | ">" => o == Ordering::Greater,
            _ => false,
        }
    }

    fn show(&self) -> String {
        match &self.constraint {
            Some((op, v)) => format!("{} ({op} {v})", self.name),
            None => self.name.clone(),
        }
    }
}

/// A release's `Packages` index for one arch (its own and `all` packages).
pub struct Index {
    packages: Vec<Paragraph>,
    by_name: HashMap<String, Vec<usize>>,
    /// virtual name → (providing package index, provided version)
    providers: HashMap<String, Vec<(usize, Option<String>)>>,
    /// The base set: packages of the base priorities (required and important
    /// by default) and what they depend on without alternatives, which every
    /// host of the release has. A dependency with alternatives is left out:
    /// which one a host has is not known.
    base: std::collections::HashSet<String>,
}

impl Index {
    pub fn parse(text: &str, base_priorities: &[String]) -> Index {
        let packages = paragraphs(text);
        let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
        let mut providers: HashMap<String, Vec<(usize, Option<String>)>> = HashMap::new();
        for (i, p) in packages.iter().enumerate() {
            if let Some(n) = p.get("Package") {
                by_name.entry(n.to_string()).or_default().push(i);
            }
            for r in p.get("Provides").unwrap_or_default().split(',').filter_map(Relation::parse) {
                providers.entry(r.name).or_default().push((i, r.constraint.map(|(_, v)| v)));
            }
        }
        let mut index = Index {
            packages,
            by_name,
            providers,
            base: Default::default(),
        };
        let mut queue: VecDeque<usize> = (0..index.packages.len())
            .filter(|i| {
                index.packages[*i]
                    .get("Priority")
                    .is_some_and(|p| base_priorities.iter().any(|b| b == p))
            })
            .collect();
        for i in &queue {
            index.base.insert(index.name(*i).to_string());
        }
        while let Some(i) = queue.pop_front() {
            for clause in index.clauses(i) {
                if clause.contains('|') {
                    continue;
                }
                let only = Relation::parse(&clause).and_then(|r| {
                    index
                        .best(&r)
                        .or_else(|| index.providers.get(&r.name).filter(|v| v.len() == 1).map(|v| v[0].0))
                });
                if let Some(d) = only
                    && index.base.insert(index.name(d).to_string())
                {
                    queue.push_back(d);
                }
            }
        }
        index
    }

    /// The Pre-Depends and Depends clauses of package `i`.
    fn clauses(&self, i: usize) -> Vec<String> {
        let p = &self.packages[i];
        [p.get("Pre-Depends"), p.get("Depends")]
            .into_iter()
            .flatten()
            .flat_map(|d| d.split(','))
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.packages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }

    fn name(&self, i: usize) -> &str {
        self.packages[i].get("Package").unwrap_or_default()
    }

    fn version(&self, i: usize) -> &str {
        self.packages[i].get("Version").unwrap_or_default()
    }

    fn is_base(&self, i: usize) -> bool {
        self.base.contains(self.name(i))
    }

    /// The newest real package named `name` that `r` allows.
    fn best(&self, r: &Relation) -> Option<usize> {
        self.by_name
            .get(&r.name)?
            .iter()
            .copied()
            .filter(|i| r.allows(Some(self.version(*i))))
            .max_by(|a, b| compare_versions(self.version(*a), self.version(*b)))
    }

    /// Is `r` met by the base set every host of the release has?
    fn base_meets(&self, r: &Relation) -> bool {
        self.by_name.get(&r.name).is_some_and(|v| v.iter().any(|i| self.is_base(*i)))
            || self.providers.get(&r.name).is_some_and(|v| {
                v.iter()
                    .any(|(i, pv)| self.is_base(*i) && (r.constraint.is_none() || r.allows(pv.as_deref())))
            })
    }
}

/// What resolution chose.
#[derive(Debug)]
pub struct Resolution {
    /// Index positions of the packages to carry, sorted by name.
    pub chosen: Vec<usize>,
    /// Requested packages already in the release's base set.
    pub in_base: Vec<String>,
}

/// Resolves `requested` and their Depends and Pre-Depends (version
/// constraints, alternatives, virtual packages through Provides), stopping at
/// the base set: priority required and important packages, which every host
/// of the release has. Every package that cannot be resolved is reported with
/// the chain that needs it.
pub fn resolve(index: &Index, requested: &[String]) -> Result<Resolution, Vec<String>> {
    let mut chosen: BTreeMap<String, usize> = BTreeMap::new();
    let mut in_base = Vec::new();
    let mut problems = BTreeSet::new();
    let mut queue: VecDeque<(usize, Vec<String>)> = VecDeque::new();
    for name in requested {
        let r = Relation {
            name: name.clone(),
            constraint: None,
        };
        match index.best(&r) {
            Some(i) if index.is_base(i) => in_base.push(name.clone()),
            Some(i) => {
                if chosen.insert(name.clone(), i).is_none() {
                    queue.push_back((i, vec![name.clone()]));
                }
            }
            None => match index.providers.get(name).and_then(|v| v.first()) {
                Some((i, _)) => {
                    let n = index.name(*i).to_string();
                    if chosen.insert(n.clone(), *i).is_none() {
                        queue.push_back((*i, vec![name.clone(), n]));
                    }
                }
                None => {
                    problems.insert(format!("{name}: not in the archive"));
                }
            },
        }
    }
    while let Some((i, chain)) = queue.pop_front() {
        for clause in index.clauses(i) {
            let alts: Vec<Relation> = clause.split('|').filter_map(Relation::parse).collect();
            let met = alts.iter().any(|r| {
                index.base_meets(r)
                    || chosen.get(&r.name).is_some_and(|c| r.allows(Some(index.version(*c))))
                    || index.providers.get(&r.name).is_some_and(|v| {
                        v.iter()
                            .any(|(pi, pv)| chosen.contains_key(index.name(*pi)) && (r.constraint.is_none() || r.allows(pv.as_deref())))
                    })
            });
            if met {
                continue;
            }
            let pick = alts.iter().find_map(|r| index.best(r)).or_else(|| {
                alts.iter().find_map(|r| {
                    let mut v: Vec<usize> = index
                        .providers
                        .get(&r.name)?
                        .iter()
                        .filter(|(_, pv)| r.constraint.is_none() || r.allows(pv.as_deref()))
                        .map(|(pi, _)| *pi)
                        .collect();
                    v.sort_by(|a, b| index.name(*a).cmp(index.name(*b)));
                    v.first().copied()
                })
            });
            match pick {
                Some(d) => {
                    let n = index.name(d).to_string();
                    if !chosen.contains_key(&n) {
                        chosen.insert(n.clone(), d);
                        let mut c = chain.clone();
                        c.push(n);
                        queue.push_back((d, c));
                    }
                }
                None => {
                    let wanted: Vec<String> = alts.iter().map(Relation::show).collect();
                    problems.insert(format!("{} → {}: not in the archive", chain.join(" → "), wanted.join(" | ")));
                }
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems.into_iter().collect());
    }
    Ok(Resolution {
        chosen: chosen.into_values().collect(),
        in_base,
    })
}

/// A flat repository, ready to pack: `.deb` blobs in the cache and the index files.
pub struct Repo {
    pub path: String,
    /// file name → sha256 of the `.deb` (in the cache)
    pub debs: Vec<(String, String)>,
    /// `Packages`, `Packages.gz`, `Release`
    pub index_files: Vec<(String, Vec<u8>)>,
}

/// Builds one repository of the lock: verifies the mirror, resolves, fetches
/// every `.deb`, and fills `item.packages`.
pub async fn build_repo(
    http: &Http,
    cache: &Cache,
    item: &mut OsRepoItem,
    keyring_text: &str,
    base_priorities: &[String],
    jobs: usize,
) -> Result<(Repo, Vec<String>), DebianError> {
    use futures_util::{StreamExt, TryStreamExt, stream};
    let artifact = format!("OS packages {} {}", item.release, item.arch);
    let keys = keyring(&item.release, keyring_text)?;
    let dist = format!("{}/dists/{}", item.mirror, item.codename);
    let inrelease_url = format!("{dist}/InRelease");
    // InRelease is remembered per URL (like addon manifests), so a warm rebuild asks nothing upstream.
    let hex = match cache.get_ref::<String>("inrelease", &inrelease_url).filter(|h| cache.has(h)) {
        Some(h) => h,
        None => {
            let bytes = http.get_bytes(&artifact, &inrelease_url).await?;
            let text = String::from_utf8_lossy(&bytes);
            verify_inrelease(&inrelease_url, &item.release, &text, &keys)?;
            let h = cache.put_bytes(&bytes).map_err(FetchError::io("cache"))?;
            cache.set_ref("inrelease", &inrelease_url, &h).map_err(FetchError::io("cache"))?;
            h
        }
    };
    let text = String::from_utf8_lossy(&cache.read(&hex).map_err(FetchError::io("cache"))?).into_owned();
    let release = verify_inrelease(&inrelease_url, &item.release, &text, &keys)?;
    let hashes = release_hashes(&release);
    let base = format!("{}/binary-{}", item.component, item.arch);
    let (name, gz) = if hashes.contains_key(&format!("{base}/Packages.gz")) {
        (format!("{base}/Packages.gz"), true)
    } else if hashes.contains_key(&format!("{base}/Packages")) {
        (format!("{base}/Packages"), false)
    } else {
        return Err(DebianError::BadIndex {
            url: inrelease_url,
            why: format!(
                "lists neither {base}/Packages.gz nor {base}/Packages; is {} {} on this mirror?",
                item.codename, item.arch
            ),
        });
    };
    let (sha, _) = hashes[&name].clone();
    let url = format!("{dist}/{name}");
    if !cache.has(&sha) {
        let bytes = http.get_bytes(&artifact, &url).await?;
        let actual = kubexm_bundle::digest::sha256_hex(&bytes);
        if actual != sha {
            return Err(DebianError::IndexDigest {
                url,
                expected: sha,
                actual,
            });
        }
        cache.put_bytes(&bytes).map_err(FetchError::io("cache"))?;
    }
    let raw = cache.read(&sha).map_err(FetchError::io("cache"))?;
    let text = if gz {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&raw[..]), &mut out).map_err(|e| DebianError::BadIndex {
            url: url.clone(),
            why: format!("not a gzip text: {e}"),
        })?;
        out
    } else {
        String::from_utf8_lossy(&raw).into_owned()
    };
    let index = Index::parse(&text, base_priorities);
    // Every role the BOM lists for this repository.
    let roles: Vec<&str> = item.roles.keys().map(String::as_str).collect();
    let requested: Vec<String> = item.packages_for(&roles);
    let resolution = resolve(&index, &requested).map_err(|p| DebianError::Unresolvable(p, item.release.clone(), item.arch.clone()))?;
    // Fetch every chosen .deb against the index's SHA256.
    let mut wanted = Vec::new();
    for &i in &resolution.chosen {
        let p = &index.packages[i];
        let (Some(filename), Some(sha)) = (p.get("Filename"), p.get("SHA256")) else {
            return Err(DebianError::BadIndex {
                url: url.clone(),
                why: format!("package {} has no Filename or SHA256", index.name(i)),
            });
        };
        wanted.push((i, filename.to_string(), sha.to_ascii_lowercase()));
    }
    stream::iter(wanted.iter())
        .map(|(i, filename, sha)| {
            let artifact = format!("{} {} ({} {})", index.name(*i), index.version(*i), item.release, item.arch);
            let url = format!("{}/{filename}", item.mirror);
            async move { http.fetch(cache, &artifact, &url, sha).await }
        })
        .buffer_unordered(jobs.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    // The flat repository: every file in one folder, the index pointing at it.
    let mut packages = String::new();
    let mut debs = Vec::new();
    item.packages.clear();
    for (i, filename, sha) in &wanted {
        let file = filename.rsplit('/').next().unwrap_or(filename).to_string();
        let mut p = index.packages[*i].clone();
        p.set("Filename", format!("./{file}"));
        packages.push_str(&p.render());
        packages.push('\n');
        item.packages.push(DebItem {
            name: index.name(*i).to_string(),
            version: index.version(*i).to_string(),
            arch: p.get("Architecture").unwrap_or_default().to_string(),
            file: file.clone(),
            size: p.get("Size").and_then(|s| s.parse().ok()).unwrap_or(0),
            sha256: sha.clone(),
        });
        debs.push((file, sha.clone()));
    }
    let packages = packages.into_bytes();
    let mut enc = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    enc.write_all(&packages).map_err(FetchError::io("Packages.gz"))?;
    let packages_gz = enc.finish().map_err(FetchError::io("Packages.gz"))?;
    let mut release = format!(
        "Origin: kubexm\nLabel: kubexm bundle {}\nCodename: {}\nArchitectures: {}\nDescription: packages for {} {} carried in a kubexm bundle\nSHA256:\n",
        item.release, item.codename, item.arch, item.release, item.arch
    );
    for (n, b) in [("Packages", &packages), ("Packages.gz", &packages_gz)] {
        release.push_str(&format!(" {} {:>12} {n}\n", kubexm_bundle::digest::sha256_hex(b), b.len()));
    }
    Ok((
        Repo {
            path: item.path.clone(),
            debs,
            index_files: vec![
                ("Packages".into(), packages),
                ("Packages.gz".into(), packages_gz),
                ("Release".into(), release.into_bytes()),
            ],
        },
        resolution.in_base,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_like_dpkg() {
        let less = [
            ("1.0", "1.1"),
            ("1.0~rc1", "1.0"),
            ("1.0", "1.0-1"),
            ("1.0-1", "1.0-2"),
            ("1:0.9", "2:0.1"),
            ("0.9", "1:0.1"),
            ("2.6.12-1", "2.6.12-1+deb12u1"),
            ("1.2a", "1.2b"),
            ("1.9", "1.10"),
            ("1.0a", "1.0+"),
        ];
        for (a, b) in less {
            assert_eq!(compare_versions(a, b), Ordering::Less, "{a} < {b}");
            assert_eq!(compare_versions(b, a), Ordering::Greater, "{b} > {a}");
        }
        assert_eq!(compare_versions("1.0-1", "0:1.0-1"), Ordering::Equal);
        assert_eq!(compare_versions("1.01", "1.1"), Ordering::Equal);
    }

    const INDEX: &str = "\
Package: base-files
Version: 12.4
Priority: required
Depends: libc6 (>= 2.36)

Package: libc6
Version: 2.36-9
Priority: optional
Provides: libc6-x

Package: app
Version: 1.0
Priority: optional
Depends: libc6 (>= 2.34), liba (>= 2) | libb, mail-transport-agent
Pre-Depends: init-system-helpers (>= 1.54~)

Package: liba
Version: 1.5
Priority: optional

Package: libb
Version: 3.0
Priority: optional
Depends: libc6-x

Package: exim
Version: 4.96
Priority: optional
Provides: mail-transport-agent

Package: init-system-helpers
Version: 1.65.2
Priority: important

Package: broken
Version: 1
Priority: optional
Depends: middle

Package: middle
Version: 1
Priority: optional
Depends: absent (>= 1.0)
";

    #[test]
    fn resolves_alternatives_virtuals_and_stops_at_the_base_set() -> Result<(), Box<dyn std::error::Error>> {
        let index = Index::parse(INDEX, &["required".into(), "important".into()]);
        let r = resolve(&index, &["app".into(), "libc6".into()]).map_err(|e| e.join("; "))?;
        let names: Vec<&str> = r.chosen.iter().map(|i| index.name(*i)).collect();
        // liba is too old for (>= 2), so libb; the virtual MTA through exim; libc6 and
        // init-system-helpers are in the base set.
        assert_eq!(names, ["app", "exim", "libb"]);
        assert_eq!(r.in_base, ["libc6"]);
        Ok(())
    }

    #[test]
    fn an_unresolvable_dependency_names_its_chain() {
        let index = Index::parse(INDEX, &["required".into(), "important".into()]);
        let e = resolve(&index, &["broken".into(), "nosuch".into()]).unwrap_err();
        assert_eq!(
            e,
            [
                "broken → middle → absent (>= 1.0): not in the archive".to_string(),
                "nosuch: not in the archive".to_string()
            ]
        );
    }

    #[test]
    fn the_built_in_debian_keyring_reads() -> Result<(), Box<dyn std::error::Error>> {
        let cat = kubexm_bom::catalog::Catalog::builtin()?;
        let text = cat.os.releases["debian-bookworm"].keyring_text()?;
        let keys = keyring("debian-bookworm", &text)?;
        assert_eq!(keys.len(), 3);
        assert!(verify_inrelease("u", "debian-bookworm", "not signed", &keys).is_err());
        Ok(())
    }

    #[test]
    fn release_hashes_are_read() {
        let r = "Codename: bookworm\nSHA256:\n 0123 10 main/binary-amd64/Packages\n abcd 20 main/binary-amd64/Packages.gz\n";
        let h = release_hashes(r);
        assert_eq!(h["main/binary-amd64/Packages.gz"], ("abcd".to_string(), 20));
    }
}
