//! A bundle's software bill of materials (issue 33), as SPDX 2.3 and
//! CycloneDX 1.6 JSON, written from `bundle.yaml` alone (the lock and the
//! member list): `kubexm-bundle inspect --sbom` prints it from any bundle
//! by reading only its first member.
//!
//! One package per file (binary or archive, per arch), addon manifest,
//! image (an index's platform manifests as its variants), chart and Debian
//! package, each with the sha256 the lock pins, a package URL and where it
//! came from; every other member (image blobs,
//! the image layout's index, the OS repositories' index files) as a file
//! package of its own, so every member of the bundle and its sha256
//! appears. The bundle is the document's one described package and
//! contains every other (SPDX: `CONTAINS` relationships; CycloneDX: the
//! BOM's subject, `metadata.component`, whose parts are its
//! `components`). A bundle carries both as its
//! members [`Format::file_name`], written from `bundle.yaml` as it lists
//! every other member, so what `inspect --sbom` writes from any bundle is
//! byte for byte what it carries.
//!
//! Written by hand with serde_json, package URLs too: the Rust crates for
//! the formats stop short of these versions (cyclonedx-bom 0.8 writes
//! CycloneDX up to 1.5; the SPDX crates write 2.2), and a package URL here
//! is one format! line.
//! Deterministic: the document's time is the bundle's fixed member mtime
//! and its identifiers derive from the sha256 of the lock, never the clock
//! or a random number, so two builds of the same inputs give the same
//! bytes.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use kubexm_bom::{ChartItem, ChartSource, Checksum, FileItem, ImageItem, ManifestItem, OsRepoItem};

use crate::manifest::BundleManifest;

/// The formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// SPDX 2.3, JSON.
    Spdx,
    /// CycloneDX 1.6, JSON.
    CycloneDx,
}

/// Every format, in the order a bundle carries them.
pub const FORMATS: [Format; 2] = [Format::Spdx, Format::CycloneDx];

impl Format {
    /// The member name a bundle would carry it under.
    pub fn file_name(self) -> &'static str {
        match self {
            Format::Spdx => "sbom.spdx.json",
            Format::CycloneDx => "sbom.cdx.json",
        }
    }
}

/// The bill of materials of the bundle `m` describes, as pretty JSON.
pub fn write(m: &BundleManifest, format: Format) -> Vec<u8> {
    let items = items(m);
    let doc = match format {
        Format::Spdx => spdx(m, &items),
        Format::CycloneDx => cyclonedx(m, &items),
    };
    let mut out = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    out.push(b'\n');
    out
}

/// What kind of thing an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Manifest,
    Image,
    Chart,
    Deb,
    /// A member no other item covers.
    Member,
}

/// One package of the bill, whatever the format.
#[derive(Debug, Clone)]
struct Item {
    kind: Kind,
    name: String,
    version: String,
    /// `sha256` hex, or empty where the lock has none.
    sha256: String,
    purl: String,
    /// Where it was fetched from; empty when not known.
    download: String,
    /// Where its digest was checked against.
    source_info: String,
    /// Its path in the bundle, when it is a member.
    path: Option<String>,
    /// An image index's platform manifests: platform, sha256, purl.
    variants: Vec<(String, String, String)>,
}

/// The sha256 of the lock (its JSON) and of the builder that wrote the
/// bundle: what the document's identifiers derive from (another lock or
/// another generator, another identity).
fn lock_digest(m: &BundleManifest) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(&m.lock).unwrap_or_default());
    h.update(b"\n");
    h.update(m.created_by.as_bytes());
    hex::encode(h.finalize())
}

/// The bundle's fixed time ([`crate::pack::MTIME`], every member's
/// mtime), as RFC 3339.
const CREATED: &str = "2020-01-01T00:00:00Z";

/// Percent-encodes `s` for a package URL's name or version (`:` and `/`
/// too: `sha256%3A...`, as the oci type's own example writes a digest).
fn pct(s: &str) -> String {
    kubexm_bom::text::percent(s, b"-._~")
}

/// Percent-encodes `s` for a package URL's qualifier value (`:` and `/`
/// kept: `repository_url=registry.k8s.io/pause`).
fn pct_value(s: &str) -> String {
    kubexm_bom::text::percent(s, b"-._~:/")
}

/// The items of the bill, in a fixed order: files, manifests, images,
/// charts, Debian packages, then the other members by path.
fn items(m: &BundleManifest) -> Vec<Item> {
    let lock = &m.lock;
    let member_sha = |path: &str| m.members.iter().find(|x| x.path == path).map(|x| x.sha256.clone());
    let mut out: Vec<Item> = lock.files.iter().map(|f| file_item(f, &member_sha)).collect();
    out.extend(lock.manifests.iter().map(|a| manifest_item(a, &member_sha)));
    out.extend(lock.images.iter().map(image_item));
    out.extend(lock.charts.iter().map(|c| chart_item(c, &member_sha)));
    out.extend(lock.os_repos.iter().flat_map(deb_items));
    let mut covered: BTreeSet<String> = out.iter().filter_map(|i| i.path.clone()).collect();
    covered.extend(
        out.iter()
            .flat_map(|i| i.variants.iter().map(|(_, hex, _)| crate::layout::blob_path(hex))),
    );
    // The bills themselves are written from what lists every other member.
    covered.extend(FORMATS.iter().map(|f| f.file_name().to_string()));
    for x in m.members.iter().filter(|x| !covered.contains(&x.path)) {
        out.push(Item {
            kind: Kind::Member,
            name: x.path.clone(),
            version: String::new(),
            sha256: x.sha256.clone(),
            purl: String::new(),
            download: String::new(),
            source_info: "a member of the bundle".into(),
            path: Some(x.path.clone()),
            variants: Vec::new(),
        });
    }
    out
}

/// The sha256 bundle.yaml lists for the member at a path.
type MemberSha<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// A binary or archive, for one arch.
fn file_item(f: &FileItem, member_sha: &MemberSha) -> Item {
    let published = |url: &str| format!("sha256 checked against the upstream's published checksum file {url}");
    let (sha, info) = match (&f.checksum, &f.checksum_url) {
        (Checksum::Sha256(h), Some(url)) => (h.clone(), published(url)),
        (Checksum::Sha256(h), None) if f.version == "extra" => (h.clone(), "sha256 pinned by the cluster config".to_string()),
        (Checksum::Sha256(h), None) => (h.clone(), "sha256 pinned by the kubexm catalog".to_string()),
        (Checksum::Published(url), _) => (
            member_sha(&f.path).unwrap_or_default(),
            published(f.checksum_url.as_deref().unwrap_or(url)),
        ),
        (Checksum::Unknown, _) => (member_sha(&f.path).unwrap_or_default(), "no upstream checksum".into()),
    };
    Item {
        kind: Kind::File,
        name: format!("{}-{}", f.component, f.arch),
        version: f.version.clone(),
        sha256: sha,
        purl: format!(
            "pkg:generic/{}@{}?arch={}&download_url={}",
            pct(&f.component),
            pct(&f.version),
            pct_value(&f.arch),
            pct_value(&f.url)
        ),
        download: f.url.clone(),
        source_info: info,
        path: Some(f.path.clone()),
        variants: Vec::new(),
    }
}

/// An addon's upstream manifest.
fn manifest_item(a: &ManifestItem, member_sha: &MemberSha) -> Item {
    Item {
        kind: Kind::Manifest,
        name: format!("{}-manifest", a.addon),
        version: a.version.clone(),
        sha256: a.sha256.clone().or_else(|| member_sha(&a.path)).unwrap_or_default(),
        purl: format!(
            "pkg:generic/{}@{}?download_url={}",
            pct(&a.addon),
            pct(&a.version),
            pct_value(&a.url)
        ),
        download: a.url.clone(),
        source_info: "sha256 pinned when the bundle was built".into(),
        path: Some(a.path.clone()),
        variants: Vec::new(),
    }
}

/// An image: its manifest or index as stored (its blob), and an index's
/// platform manifests as its variants.
fn image_item(i: &ImageItem) -> Item {
    let r = &i.reference;
    let digest = i.digest.clone().or_else(|| r.digest.clone()).unwrap_or_default();
    let last = r.repository.rsplit('/').next().unwrap_or(&r.repository);
    let repository = pct_value(&format!("{}/{}", r.registry, r.repository));
    let mut purl = format!("pkg:oci/{}@{}?repository_url={repository}", pct(last), pct(&digest));
    if let Some(t) = &r.tag {
        purl.push_str(&format!("&tag={}", pct_value(t)));
    }
    let variants = i
        .platform_manifests
        .iter()
        .map(|(platform, d)| {
            let (os, arch) = platform.split_once('/').unwrap_or(("linux", platform));
            let purl = format!(
                "pkg:oci/{}@{}?arch={}&os={}&repository_url={repository}",
                pct(last),
                pct(d),
                pct_value(arch),
                pct_value(os)
            );
            (platform.clone(), d.strip_prefix("sha256:").unwrap_or(d).to_string(), purl)
        })
        .collect();
    let mut info = format!("manifest digest as stored, for {}", i.platforms.join(", "));
    if let Some(up) = &i.upstream_digest {
        info.push_str(&format!("; narrowed from the upstream's index {up}"));
    }
    let hex = digest.strip_prefix("sha256:").unwrap_or(&digest).to_string();
    Item {
        kind: Kind::Image,
        name: r.to_string(),
        version: r.tag.clone().unwrap_or_else(|| digest.clone()),
        path: Some(crate::layout::blob_path(&hex)),
        sha256: hex,
        purl,
        download: String::new(),
        source_info: info,
        variants,
    }
}

/// A Helm chart; its upstream is its download location only when it is a
/// web address (an OCI reference or repository name is not one).
fn chart_item(c: &ChartItem, member_sha: &MemberSha) -> Item {
    let fetched = match &c.source {
        ChartSource::Repo { repo } => repo,
        ChartSource::Url { url } => url,
        ChartSource::Oci { reference } => reference,
    };
    let web = c.upstream.starts_with("https://") || c.upstream.starts_with("http://");
    let mut purl = format!("pkg:generic/{}@{}", pct(&c.name), pct(&c.version));
    if web {
        purl.push_str(&format!("?download_url={}", pct_value(&c.upstream)));
    }
    Item {
        kind: Kind::Chart,
        name: c.name.clone(),
        version: c.version.clone(),
        sha256: c.sha256.clone().or_else(|| member_sha(&c.path)).unwrap_or_default(),
        purl,
        download: if web { c.upstream.clone() } else { String::new() },
        source_info: format!(
            "a Helm chart from {}, fetched from {fetched}; sha256 pinned when the bundle was built",
            c.upstream
        ),
        path: Some(c.path.clone()),
        variants: Vec::new(),
    }
}

/// The Debian packages of one repository.
fn deb_items(r: &OsRepoItem) -> impl Iterator<Item = Item> + '_ {
    r.packages.iter().map(move |d| Item {
        kind: Kind::Deb,
        name: d.name.clone(),
        version: d.version.clone(),
        sha256: d.sha256.clone(),
        purl: format!(
            "pkg:deb/{}/{}@{}?arch={}&distro={}",
            pct(&r.distro),
            pct(&d.name),
            pct(&d.version),
            pct_value(&d.arch),
            pct_value(&format!("{}-{}", r.distro, r.codename))
        ),
        download: String::new(),
        source_info: format!("from the Debian archive {} {} {}", r.mirror, r.codename, r.component),
        path: Some(format!("{}/{}", r.path, d.file)),
        variants: Vec::new(),
    })
}

/// The SPDX 2.3 document.
fn spdx(m: &BundleManifest, items: &[Item]) -> Value {
    let lock = lock_digest(m);
    let bundle_id = "SPDXRef-Bundle";
    let mut packages = vec![json!({
        "SPDXID": bundle_id,
        "name": format!("kubexm bundle {}", m.name),
        "versionInfo": m.lock.kubernetes_version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "primaryPackagePurpose": "ARCHIVE",
        "supplier": "Organization: kubexm",
        "comment": format!("Kubernetes {} for {}; lock sha256:{lock}", m.lock.kubernetes_version, m.lock.arches.join(", ")),
    })];
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": bundle_id,
    })];
    for (n, i) in items.iter().enumerate() {
        let id = format!("SPDXRef-{}-{n}", spdx_kind(i.kind));
        let mut p = json!({
            "SPDXID": id,
            "name": i.name,
            "downloadLocation": spdx_location(&i.download),
            "filesAnalyzed": false,
            "primaryPackagePurpose": spdx_purpose(i.kind),
            "sourceInfo": i.source_info,
        });
        if !i.version.is_empty() {
            p["versionInfo"] = json!(i.version);
        }
        if !i.sha256.is_empty() {
            p["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": i.sha256}]);
        }
        if !i.purl.is_empty() {
            p["externalRefs"] = json!([{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": i.purl,
            }]);
        }
        if let Some(path) = &i.path {
            p["packageFileName"] = json!(path);
        }
        packages.push(p);
        relationships.push(json!({
            "spdxElementId": bundle_id,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": id,
        }));
        for (k, (platform, sha256, purl)) in i.variants.iter().enumerate() {
            let vid = format!("{id}-{k}");
            packages.push(json!({
                "SPDXID": vid,
                "name": format!("{} ({platform})", i.name),
                "versionInfo": platform,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": false,
                "primaryPackagePurpose": "CONTAINER",
                "checksums": [{"algorithm": "SHA256", "checksumValue": sha256}],
                "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}],
            }));
            relationships.push(json!({
                "spdxElementId": vid,
                "relationshipType": "VARIANT_OF",
                "relatedSpdxElement": id,
            }));
        }
    }
    json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("kubexm bundle {}", m.name),
        "documentNamespace": format!("https://kubexm.io/spdx/bundles/{}/{lock}", pct(&m.name)),
        "creationInfo": {
            "created": CREATED,
            "creators": [format!("Tool: {}", m.created_by.replace(' ', "-"))],
        },
        "packages": packages,
        "relationships": relationships,
    })
}

/// `url` as SPDX's `downloadLocation`, where SPDX's tools accept it: an
/// http(s) URL whose host is a name (a mirror by address, or none, is
/// NOASSERTION; where an item came from is also in its `sourceInfo`).
fn spdx_location(url: &str) -> &str {
    let host = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .and_then(|rest| rest.split(['/', ':', '?', '#']).next())
        .unwrap_or_default();
    let tld = host.rsplit('.').next().unwrap_or_default();
    if host.contains('.') && !tld.is_empty() && tld.bytes().all(|b| b.is_ascii_alphabetic()) {
        url
    } else {
        "NOASSERTION"
    }
}

fn spdx_kind(k: Kind) -> &'static str {
    match k {
        Kind::File => "File",
        Kind::Manifest => "Manifest",
        Kind::Image => "Image",
        Kind::Chart => "Chart",
        Kind::Deb => "Deb",
        Kind::Member => "Member",
    }
}

fn spdx_purpose(k: Kind) -> &'static str {
    match k {
        Kind::File => "APPLICATION",
        Kind::Manifest => "INSTALL",
        Kind::Image => "CONTAINER",
        Kind::Chart => "INSTALL",
        Kind::Deb => "LIBRARY",
        Kind::Member => "FILE",
    }
}

/// A UUID of version 8 (RFC 9562's custom layout) from `hex`'s first 32
/// digits.
fn uuid_of(hex: &str) -> String {
    let mut b: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0))
        .collect();
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(&b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// The CycloneDX 1.6 document.
fn cyclonedx(m: &BundleManifest, items: &[Item]) -> Value {
    let lock = lock_digest(m);
    let bundle_ref = "bundle";
    let mut components = Vec::new();
    for (n, i) in items.iter().enumerate() {
        let bom_ref = format!("{}-{n}", spdx_kind(i.kind).to_lowercase());
        let mut c = json!({
            "bom-ref": bom_ref,
            "type": cdx_type(i.kind),
            "name": i.name,
        });
        if !i.version.is_empty() {
            c["version"] = json!(i.version);
        }
        if !i.sha256.is_empty() {
            c["hashes"] = json!([{"alg": "SHA-256", "content": i.sha256}]);
        }
        if !i.purl.is_empty() {
            c["purl"] = json!(i.purl);
        }
        let mut props = vec![json!({"name": "kubexm:source", "value": i.source_info})];
        if let Some(path) = &i.path {
            props.push(json!({"name": "kubexm:bundle-path", "value": path}));
        }
        c["properties"] = json!(props);
        if !i.download.is_empty() {
            c["externalReferences"] = json!([{"type": "distribution", "url": i.download}]);
        }
        if !i.variants.is_empty() {
            let variants: Vec<Value> = i
                .variants
                .iter()
                .enumerate()
                .map(|(k, (platform, sha256, purl))| {
                    json!({
                        "bom-ref": format!("{bom_ref}-{k}"),
                        "type": "container",
                        "name": format!("{} ({platform})", i.name),
                        "version": platform,
                        "hashes": [{"alg": "SHA-256", "content": sha256}],
                        "purl": purl,
                    })
                })
                .collect();
            c["pedigree"] = json!({"variants": variants});
        }
        components.push(c);
    }
    json!({
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": format!("urn:uuid:{}", uuid_of(&lock)),
        "version": 1,
        "metadata": {
            "timestamp": CREATED,
            "tools": {"components": [{"type": "application", "name": m.created_by}]},
            "component": {
                "bom-ref": bundle_ref,
                "type": "data",
                "name": format!("kubexm bundle {}", m.name),
                "version": m.lock.kubernetes_version,
                "description": format!("Kubernetes {} for {}; lock sha256:{lock}", m.lock.kubernetes_version, m.lock.arches.join(", ")),
            },
        },
        "components": components,
    })
}

fn cdx_type(k: Kind) -> &'static str {
    match k {
        Kind::File => "application",
        Kind::Manifest => "data",
        Kind::Image => "container",
        Kind::Chart => "data",
        Kind::Deb => "library",
        Kind::Member => "file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Member;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const C: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    const D: &str = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";
    const E: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

    /// A bundle of one binary, one image (its index a blob), one Debian
    /// package, the image layout's index, and the bills themselves.
    fn bundle() -> BundleManifest {
        let member = |path: &str, sha256: &str| Member {
            path: path.into(),
            size: 1,
            sha256: sha256.into(),
            from_base: false,
        };
        let mut m = crate::testing::manifest(vec![
            member("files/amd64/kubeadm", A),
            member(&crate::layout::blob_path(B), B),
            member("images/index.json", C),
            member("os/debian-bookworm/amd64/conntrack_1.4.7-1_amd64.deb", D),
            member("sbom.cdx.json", "ee"),
            member("sbom.spdx.json", "ff"),
        ]);
        m.lock = serde_json::from_value(json!({
            "cluster": "t", "kubernetesVersion": "v1.37.2", "arches": ["amd64"],
            "files": [{"component": "kubeadm", "version": "v1.37.2", "arch": "amd64",
                       "url": "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubeadm",
                       "source": "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubeadm",
                       "checksum": {"sha256": A}, "path": "files/amd64/kubeadm", "archive": "none",
                       "checksumUrl": "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubeadm.sha256"}],
            "manifests": [],
            "images": [{"reference": "registry.k8s.io/pause:3.10", "platforms": ["linux/amd64"],
                        "digest": format!("sha256:{B}"), "platformManifests": {"linux/amd64": format!("sha256:{E}")}}],
            "charts": [],
            "osRepos": [{"release": "debian-bookworm", "distro": "debian", "codename": "bookworm",
                         "component": "main", "arch": "amd64", "mirror": "http://deb.debian.org/debian",
                         "path": "os/debian-bookworm/amd64", "roles": {},
                         "packages": [{"name": "conntrack", "version": "1:1.4.7-1", "arch": "amd64",
                                       "file": "conntrack_1.4.7-1_amd64.deb", "size": 1, "sha256": D}]}]
        }))
        .unwrap_or_default();
        m
    }

    fn sha256s(doc: &Value) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let text = doc.to_string();
        for w in text.split('"') {
            if w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit()) {
                out.insert(w.to_string());
            }
        }
        out
    }

    /// Issue 33: both bills name every member but themselves by its
    /// sha256, each item by the lock's digest and a package URL, and an
    /// index's platform manifests as its variants; the same bundle gives
    /// the same bytes.
    #[test]
    fn every_member_appears_with_the_locks_digests_and_the_bytes_are_stable() {
        let m = bundle();
        assert_eq!(m.lock.files.len(), 1, "the lock did not read");
        for format in FORMATS {
            let bytes = write(&m, format);
            assert_eq!(bytes, write(&m, format), "{format:?} is not deterministic");
            let doc: Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let seen = sha256s(&doc);
            // The upstream's checksum source, as published (never a mirror's).
            assert!(
                doc.to_string()
                    .contains("published checksum file https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubeadm.sha256"),
                "{format:?}: the checksum source is missing"
            );
            for sha in [A, B, C, D, E] {
                assert!(seen.contains(sha), "{format:?}: {sha} missing");
            }
            let text = doc.to_string();
            assert!(!text.contains("sbom.spdx.json") && !text.contains("sbom.cdx.json"), "{text}");
            for purl in [
                "pkg:generic/kubeadm@v1.37.2?arch=amd64&download_url=https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubeadm",
                "pkg:oci/pause@sha256%3Abbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb?repository_url=registry.k8s.io/pause&tag=3.10",
                "pkg:deb/debian/conntrack@1%3A1.4.7-1?arch=amd64&distro=debian-bookworm",
                "pkg:oci/pause@sha256%3Aeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee?arch=amd64&os=linux&repository_url=registry.k8s.io/pause",
            ] {
                assert!(text.contains(purl), "{format:?}: no {purl} in {text}");
            }
        }
        let spdx: Value = serde_json::from_slice(&write(&m, Format::Spdx)).unwrap_or_default();
        assert_eq!(spdx["spdxVersion"], "SPDX-2.3");
        assert_eq!(spdx["creationInfo"]["created"], CREATED);
        // The bundle, then kubeadm, the image (its index: the blob) and its
        // amd64 manifest, conntrack, and the layout's index.
        assert_eq!(spdx["packages"].as_array().map(Vec::len), Some(6));
        let count = |t: &str| {
            spdx["relationships"]
                .as_array()
                .map(|r| r.iter().filter(|x| x["relationshipType"] == t).count())
        };
        assert_eq!(count("CONTAINS"), Some(4));
        assert_eq!(count("VARIANT_OF"), Some(1));
        let cdx: Value = serde_json::from_slice(&write(&m, Format::CycloneDx)).unwrap_or_default();
        assert_eq!(cdx["specVersion"], "1.6");
        assert_eq!(cdx["components"][1]["pedigree"]["variants"][0]["version"], "linux/amd64");
        let serial = cdx["serialNumber"].as_str().unwrap_or_default();
        let uuid = serial.strip_prefix("urn:uuid:").unwrap_or_default();
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{serial}");
        assert_eq!(&uuid[14..15], "8", "{serial}");
        // Written before the bills were listed, or after: the same bytes.
        let mut unlisted = m.clone();
        unlisted.members.retain(|x| !x.path.starts_with("sbom."));
        for format in FORMATS {
            assert_eq!(write(&unlisted, format), write(&m, format), "{format:?}");
        }
        // Another lock, another identity.
        let mut other = m.clone();
        other.lock.kubernetes_version = "v1.37.3".into();
        let other: Value = serde_json::from_slice(&write(&other, Format::CycloneDx)).unwrap_or_default();
        assert_ne!(other["serialNumber"], cdx["serialNumber"]);
    }

    /// SPDX's tools take a download location only as an http(s) URL of a
    /// named host: a mirror by address or anything else is NOASSERTION.
    #[test]
    fn download_locations_spdx_accepts() {
        assert_eq!(spdx_location("https://dl.k8s.io/x/y"), "https://dl.k8s.io/x/y");
        assert_eq!(
            spdx_location("http://charts.lab.invalid:8080/x"),
            "http://charts.lab.invalid:8080/x"
        );
        for bad in [
            "http://198.18.0.1:8080/debian",
            "oci://ghcr.io/x",
            "",
            "https://localhost/x",
            "https://x.k8s/",
        ] {
            assert_eq!(spdx_location(bad), "NOASSERTION", "{bad}");
        }
        assert_eq!(crate::pack::MTIME, 1_577_836_800, "CREATED is 2020-01-01T00:00:00Z");
    }
}
