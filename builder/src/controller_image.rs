//! The controller's image (issue 31): with `operator.enabled: true`,
//! `kubexm-bundle build` makes an OCI image of the `kubexm` binary (whose
//! `controller-manager` reconciles the Cluster object inside the cluster)
//! for each arch it has a binary for, with the `kubexm-install` beside it
//! (the registry service it puts on a new registry host), the loader and
//! shared libraries the two load, a user of its own and a `/tmp`. No registry serves it: its blobs go into the
//! build cache and the bundle as a pulled image's do, and the lock pins its
//! digest like every image's.
//!
//! The binary is the `kubexm` beside the running `kubexm-bundle` (the
//! release's own), for the arch it was built for; `--controller-binary
//! ARCH=FILE` names one for another arch, or another file. Each file's ELF
//! header is read: its machine must be the arch it is given for, and its
//! interpreter and every library it needs (and theirs) are found in that
//! arch's system directories of the build machine (Debian's multiarch
//! paths), copied to the same paths in the image.
//!
//! The image is reproducible: one layer, a tar whose entries have fixed
//! owners, modes and times (directories, then files, each in path order),
//! and a config with no creation time; the same binaries and the same
//! libraries of the build machine give the same digest (another libc
//! gives another; the install rolls the Deployment out to what the bundle
//! carries, and the cluster's record does not hold it). It
//! runs as user 65532 (`nonroot`), with `/tmp` writable. The layer is not
//! compressed: the bundle's zstd compresses it on all cores, where a gzip
//! layer would take one core most of a minute for the debug binaries, and
//! only the control-plane nodes pull it, from the registry host.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use kubexm_bom::ImageItem;
use kubexm_bundle::layout::{OCI_INDEX, OCI_MANIFEST};

use crate::cache::Cache;
use crate::fetch::images::Pulled;

/// Where the binary is in the image, and what the image runs.
pub const BINARY_PATH: &str = "/usr/local/bin/kubexm";
/// Where `kubexm-install` is in the image: the controller puts it on a
/// registry host it moves the registry to, as an install does. It is the
/// file beside the `kubexm` given, byte for byte the release's.
pub const INSTALLER_PATH: &str = "/usr/local/bin/kubexm-install";
const USER: u32 = 65532;
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// Why the image could not be made; each names the file or flag to fix.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("--controller-binary {0}: expected ARCH=FILE with ARCH amd64 or arm64")]
    BadFlag(String),
    #[error("--controller-binary {arch}={}: no such file", path.display())]
    Missing { arch: String, path: PathBuf },
    #[error(
        "the controller's image (operator.enabled: true) needs the kubexm binary: {0} is missing; \
         install kubexm beside kubexm-bundle, or pass --controller-binary ARCH=FILE"
    )]
    NoBinary(PathBuf),
    #[error(
        "the controller's image needs kubexm-install beside {}: {} is missing; \
         it is the registry service the controller puts on a new registry host",
        kubexm.display(), installer.display()
    )]
    NoInstaller { kubexm: PathBuf, installer: PathBuf },
    #[error(
        "the controller's image: no kubexm binary for the control-plane nodes' platforms ({wanted}); \
         pass --controller-binary ARCH=FILE for one of them"
    )]
    NoPlatform { wanted: String },
    #[error("{path}: {why}")]
    Elf { path: PathBuf, why: String },
    #[error(
        "{path} needs {library}, which is not in {dirs}; install the {arch} C libraries on this machine \
         (Debian: dpkg --add-architecture {arch}; apt-get install libc6:{arch} libgcc-s1:{arch})"
    )]
    Library {
        path: PathBuf,
        library: String,
        dirs: String,
        arch: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A `kubexm` binary and the arch it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    pub arch: String,
    pub path: PathBuf,
}

/// The arch this program was built for, as the bundle names arches.
pub fn own_arch() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Some("amd64"),
        "aarch64" => Some("arm64"),
        _ => None,
    }
}

/// The binaries the image is made of: each `--controller-binary ARCH=FILE`,
/// and the `kubexm` beside this program for its own arch unless one was
/// given for it. A missing file is an error only when it is needed
/// ([`build`]), so a config without the controller never looks.
pub fn binaries(flags: &[String]) -> Result<Vec<Binary>, ImageError> {
    let mut by_arch = BTreeMap::new();
    for f in flags {
        let (arch, path) = f.split_once('=').ok_or_else(|| ImageError::BadFlag(f.clone()))?;
        if !matches!(arch, "amd64" | "arm64") || path.is_empty() {
            return Err(ImageError::BadFlag(f.clone()));
        }
        if !Path::new(path).is_file() {
            return Err(ImageError::Missing {
                arch: arch.into(),
                path: path.into(),
            });
        }
        by_arch.insert(arch.to_string(), PathBuf::from(path));
    }
    if let Some(arch) = own_arch()
        && !by_arch.contains_key(arch)
        && let Some(dir) = std::env::current_exe().ok().as_deref().and_then(Path::parent)
    {
        by_arch.insert(arch.to_string(), dir.join("kubexm"));
    }
    Ok(by_arch.into_iter().map(|(arch, path)| Binary { arch, path }).collect())
}

/// The image `item` names, for those of its platforms a binary is given
/// for, into the cache (made again only when a binary or library changed);
/// returns it as a pull would, and the platforms it has.
pub fn build(cache: &Cache, item: &ImageItem, binaries: &[Binary]) -> Result<(Pulled, Vec<String>), ImageError> {
    let chosen: Vec<(&String, &Binary)> = item
        .platforms
        .iter()
        .filter_map(|p| {
            let arch = p.strip_prefix("linux/")?;
            binaries.iter().find(|b| b.arch == arch).map(|b| (p, b))
        })
        .collect();
    let present: Vec<_> = chosen.iter().filter(|(_, b)| b.path.is_file()).copied().collect();
    if present.is_empty() {
        // The binary beside this program, when that was the one looked for.
        if let Some((_, b)) = chosen.first() {
            return Err(ImageError::NoBinary(b.path.clone()));
        }
        return Err(ImageError::NoPlatform {
            wanted: item.platforms.join(", "),
        });
    }
    let mut entries = Vec::new();
    let mut blobs = Vec::new();
    let mut manifests = BTreeMap::new();
    for (platform, binary) in &present {
        let files = image_files(binary, Path::new("/"))?;
        let (manifest, manifest_blobs) = platform_image(cache, &binary.arch, &files)?;
        blobs.extend(manifest_blobs);
        entries.push(serde_json::json!({
            "mediaType": OCI_MANIFEST,
            "digest": format!("sha256:{}", manifest.0),
            "size": manifest.1,
            "platform": {"architecture": binary.arch, "os": "linux"},
        }));
        manifests.insert((*platform).clone(), format!("sha256:{}", manifest.0));
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": entries,
        "annotations": {"org.opencontainers.image.title": "kubexm controller-manager"},
    });
    let bytes = serde_json::to_vec(&index).map_err(|e| io(Path::new("index.json"))(std::io::Error::other(e)))?;
    let hex = cache.put_bytes(&bytes).map_err(io(Path::new("the build cache")))?;
    blobs.push(hex.clone());
    blobs.sort();
    blobs.dedup();
    let platforms = present.iter().map(|(p, _)| (*p).clone()).collect();
    Ok((
        Pulled {
            digest: format!("sha256:{hex}"),
            media_type: OCI_INDEX.into(),
            size: bytes.len() as u64,
            upstream_digest: None,
            blobs,
            manifests,
        },
        platforms,
    ))
}

/// One file of the image: its path there, where its content is read from, its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ImageFile {
    path: String,
    from: PathBuf,
    mode: u32,
}

/// The binary at [`BINARY_PATH`], `kubexm-install` beside it at
/// [`INSTALLER_PATH`], and their interpreter and libraries at their own
/// paths, found under `root` (`/` but in tests).
fn image_files(binary: &Binary, root: &Path) -> Result<Vec<ImageFile>, ImageError> {
    let installer = binary.path.with_file_name("kubexm-install");
    if !installer.is_file() {
        return Err(ImageError::NoInstaller {
            kubexm: binary.path.clone(),
            installer,
        });
    }
    let mut files = Vec::new();
    let mut wanted: Vec<(String, PathBuf)> = Vec::new();
    for (path, from) in [(BINARY_PATH, &binary.path), (INSTALLER_PATH, &installer)] {
        let bytes = fs_err::read(from).map_err(io(from))?;
        let elf = elf::read(&bytes).map_err(|why| ImageError::Elf { path: from.clone(), why })?;
        if elf.arch != binary.arch {
            return Err(ImageError::Elf {
                path: from.clone(),
                why: format!("it is a {} program, given for {}", elf.arch, binary.arch),
            });
        }
        files.push(ImageFile {
            path: path.into(),
            from: from.clone(),
            mode: 0o755,
        });
        if let Some(interp) = &elf.interpreter {
            let at = under(root, interp);
            if !at.is_file() {
                return Err(ImageError::Library {
                    path: from.clone(),
                    library: interp.clone(),
                    dirs: "its path".into(),
                    arch: binary.arch.clone(),
                });
            }
            files.push(ImageFile {
                path: interp.clone(),
                from: at,
                mode: 0o755,
            });
        }
        wanted.extend(elf.needed.into_iter().map(|l| (l, from.clone())));
    }
    let dirs = library_dirs(&binary.arch);
    while let Some((library, by)) = wanted.pop() {
        let programs = [BINARY_PATH, INSTALLER_PATH];
        if files
            .iter()
            .any(|f| f.path.rsplit('/').next() == Some(library.as_str()) && !programs.contains(&f.path.as_str()))
        {
            continue;
        }
        let found = dirs.iter().map(|d| format!("{d}/{library}")).find(|p| under(root, p).is_file());
        let Some(path) = found else {
            return Err(ImageError::Library {
                path: by,
                library,
                dirs: dirs.join(", "),
                arch: binary.arch.clone(),
            });
        };
        let from = under(root, &path);
        let lib = fs_err::read(&from).map_err(io(&from))?;
        let lib_elf = elf::read(&lib).map_err(|why| ImageError::Elf { path: from.clone(), why })?;
        if lib_elf.arch != binary.arch {
            return Err(ImageError::Elf {
                path: from,
                why: format!("a {} library, found for {} needed by {}", lib_elf.arch, binary.arch, by.display()),
            });
        }
        wanted.extend(lib_elf.needed.into_iter().map(|l| (l, from.clone())));
        files.push(ImageFile { path, from, mode: 0o755 });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup_by(|a, b| a.path == b.path);
    Ok(files)
}

fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Where the dynamic loader looks for an arch's libraries on Debian: its
/// multiarch directories only (another arch's files are never there).
fn library_dirs(arch: &str) -> Vec<String> {
    let triplet = if arch == "arm64" { "aarch64-linux-gnu" } else { "x86_64-linux-gnu" };
    vec![format!("/lib/{triplet}"), format!("/usr/lib/{triplet}")]
}

/// The image of one platform: its layer, config and manifest into the
/// cache; returns the manifest's (hex, size) and every blob's hex.
fn platform_image(cache: &Cache, arch: &str, files: &[ImageFile]) -> Result<((String, u64), Vec<String>), ImageError> {
    let (layer, layer_size, diff_id) = layer(cache, files)?;
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": format!("{USER}:{USER}"),
            "Env": ["PATH=/usr/local/bin", "HOME=/home/nonroot"],
            "Entrypoint": [BINARY_PATH],
            "Cmd": ["controller-manager"],
            "WorkingDir": "/home/nonroot",
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created_by": concat!("kubexm-bundle ", env!("CARGO_PKG_VERSION"), ": the kubexm binary and its libraries")}],
    });
    let config_bytes = serde_json::to_vec(&config).map_err(|e| io(Path::new("config"))(std::io::Error::other(e)))?;
    let config_hex = cache.put_bytes(&config_bytes).map_err(io(Path::new("the build cache")))?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": format!("sha256:{config_hex}"), "size": config_bytes.len()},
        "layers": [{"mediaType": OCI_LAYER, "digest": format!("sha256:{layer}"), "size": layer_size}],
    });
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|e| io(Path::new("manifest"))(std::io::Error::other(e)))?;
    let manifest_hex = cache.put_bytes(&manifest_bytes).map_err(io(Path::new("the build cache")))?;
    Ok((
        (manifest_hex.clone(), manifest_bytes.len() as u64),
        vec![layer, config_hex, manifest_hex],
    ))
}

/// Counts and hashes what goes through it, written or read.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn hashing<W: Write>(inner: W) -> Hashing<W> {
    Hashing {
        inner,
        hash: Sha256::new(),
        bytes: 0,
    }
}

/// The layer, a tar, into the cache (kept when the same files made it
/// before): returns its hex, size and diff id (the same, uncompressed).
fn layer(cache: &Cache, files: &[ImageFile]) -> Result<(String, u64, String), ImageError> {
    // What the layer is made of, so an unchanged binary is not packed again.
    let mut key = String::from("v2");
    let mut sums = Vec::new();
    for f in files {
        let sum = file_sha256(&f.from)?;
        key.push_str(&format!("|{}={sum}:{:o}", f.path, f.mode));
        sums.push(sum);
    }
    if let Some((hex, size, diff)) = cache.get_ref::<(String, u64, String)>("controller-layer", &key)
        && cache.has(&hex)
    {
        return Ok((hex, size, diff));
    }
    let tmp = cache.partial(&key);
    let file = fs_err::File::create(&tmp).map_err(io(&tmp))?;
    let mut tar = tar::Builder::new(hashing(file));
    tar.mode(tar::HeaderMode::Deterministic);
    for (path, mode, uid) in directories(files) {
        let mut h = header(tar::EntryType::Directory, mode, uid, 0);
        tar.append_data(&mut h, path.trim_start_matches('/'), std::io::empty())
            .map_err(io(&tmp))?;
    }
    let mut extra: Vec<(&str, &[u8])> = vec![("etc/group", GROUP.as_bytes()), ("etc/passwd", PASSWD.as_bytes())];
    extra.sort();
    for (path, bytes) in extra {
        let mut h = header(tar::EntryType::Regular, 0o644, 0, bytes.len() as u64);
        tar.append_data(&mut h, path, bytes).map_err(io(&tmp))?;
    }
    for (f, sum) in files.iter().zip(&sums) {
        let mut src = fs_err::File::open(&f.from).map_err(io(&f.from))?;
        let size = src.metadata().map_err(io(&f.from))?.len();
        let mut h = header(tar::EntryType::Regular, f.mode, 0, size);
        let mut read = Hashing {
            inner: (&mut src).take(size),
            hash: Sha256::new(),
            bytes: 0,
        };
        tar.append_data(&mut h, f.path.trim_start_matches('/'), &mut read)
            .map_err(io(&f.from))?;
        // What went into the layer is what the key names, whole.
        if read.bytes != size || hex::encode(read.hash.finalize()) != *sum {
            return Err(ImageError::Elf {
                path: f.from.clone(),
                why: "it changed while it was packed; build again once it is written".into(),
            });
        }
    }
    let mut out = tar.into_inner().map_err(io(&tmp))?;
    out.flush().map_err(io(&tmp))?;
    let hex = hex::encode(out.hash.finalize());
    let size = out.bytes;
    out.inner.sync_all().map_err(io(&tmp))?;
    drop(out.inner);
    cache.commit(&tmp, &hex).map_err(io(&tmp))?;
    cache
        .set_ref("controller-layer", &key, &(hex.clone(), size, hex.clone()))
        .map_err(io(Path::new("the build cache")))?;
    Ok((hex.clone(), size, hex))
}

const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnonroot:x:65532:\n";

/// Every directory the layer needs, with its mode and owner, parents first.
fn directories(files: &[ImageFile]) -> Vec<(String, u32, u32)> {
    let mut dirs: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for f in files.iter().map(|f| f.path.as_str()).chain(["/etc/passwd"]) {
        let mut at = String::new();
        let parts: Vec<&str> = f.trim_start_matches('/').split('/').collect();
        for p in &parts[..parts.len() - 1] {
            at.push('/');
            at.push_str(p);
            dirs.entry(format!("{at}/")).or_insert((0o755, 0));
        }
    }
    dirs.insert("/home/".into(), (0o755, 0));
    dirs.insert("/home/nonroot/".into(), (0o755, USER));
    dirs.insert("/tmp/".into(), (0o1777, 0));
    dirs.into_iter().map(|(p, (mode, uid))| (p, mode, uid)).collect()
}

fn header(kind: tar::EntryType, mode: u32, uid: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid.into());
    h.set_gid(uid.into());
    h.set_mtime(0);
    h.set_size(size);
    h
}

fn file_sha256(path: &Path) -> Result<String, ImageError> {
    let mut f = fs_err::File::open(path).map_err(io(path))?;
    let mut hash = hashing(std::io::sink());
    std::io::copy(&mut f, &mut hash).map_err(io(path))?;
    Ok(hex::encode(hash.hash.finalize()))
}

/// Just enough of ELF to know what a program loads: its machine, its
/// interpreter and the libraries its dynamic section needs.
mod elf {
    pub struct Elf {
        /// `amd64`, `arm64`, or the machine number.
        pub arch: String,
        pub interpreter: Option<String>,
        pub needed: Vec<String>,
    }

    const PT_LOAD: u32 = 1;
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    const DT_STRTAB: u64 = 5;

    /// At most this many program headers and needed libraries, and names
    /// this long: a real program has a dozen of each, and a hostile file
    /// cannot make the reader loop or allocate without bound.
    const MAX_ENTRIES: usize = 1024;
    const MAX_NAME: usize = 4096;

    fn bytes_at<const N: usize>(b: &[u8], at: u64) -> Option<[u8; N]> {
        let at = usize::try_from(at).ok()?;
        b.get(at..at.checked_add(N)?)?.try_into().ok()
    }
    fn u16_at(b: &[u8], at: u64) -> Option<u16> {
        bytes_at(b, at).map(u16::from_le_bytes)
    }
    fn u32_at(b: &[u8], at: u64) -> Option<u32> {
        bytes_at(b, at).map(u32::from_le_bytes)
    }
    fn u64_at(b: &[u8], at: u64) -> Option<u64> {
        bytes_at(b, at).map(u64::from_le_bytes)
    }
    fn c_string(b: &[u8], at: u64) -> Option<String> {
        let rest = b.get(usize::try_from(at).ok()?..)?;
        let end = rest.iter().take(MAX_NAME).position(|&c| c == 0)?;
        String::from_utf8(rest[..end].to_vec()).ok()
    }

    struct Segment {
        kind: u32,
        offset: u64,
        vaddr: u64,
        filesz: u64,
    }

    /// A 64-bit little-endian ELF file's machine, interpreter and needed libraries.
    pub fn read(b: &[u8]) -> Result<Elf, String> {
        if b.get(..4) != Some(b"\x7fELF".as_slice()) {
            return Err("not an ELF program".into());
        }
        if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
            return Err("not a 64-bit little-endian ELF program".into());
        }
        let short = || "a truncated ELF header".to_string();
        let machine = u16_at(b, 18).ok_or_else(short)?;
        let phoff = u64_at(b, 32).ok_or_else(short)?;
        let phentsize = u64::from(u16_at(b, 54).ok_or_else(short)?);
        let phnum = usize::from(u16_at(b, 56).ok_or_else(short)?);
        if phnum > MAX_ENTRIES {
            return Err(format!("{phnum} program headers"));
        }
        let arch = match machine {
            62 => "amd64".to_string(),
            183 => "arm64".to_string(),
            m => format!("machine {m}"),
        };
        let mut segments = Vec::new();
        for i in 0..phnum as u64 {
            let bad = || format!("program header {i} is outside the file");
            let at = i.checked_mul(phentsize).and_then(|o| o.checked_add(phoff)).ok_or_else(bad)?;
            let field = |off: u64| at.checked_add(off).ok_or_else(bad);
            segments.push(Segment {
                kind: u32_at(b, at).ok_or_else(bad)?,
                offset: u64_at(b, field(8)?).ok_or_else(bad)?,
                vaddr: u64_at(b, field(16)?).ok_or_else(bad)?,
                filesz: u64_at(b, field(32)?).ok_or_else(bad)?,
            });
        }
        let interpreter = match segments.iter().find(|s| s.kind == PT_INTERP) {
            Some(s) => {
                let path = c_string(b, s.offset).ok_or("a bad interpreter path")?;
                if !path.starts_with('/') || path.split('/').any(|p| p == "..") {
                    return Err(format!("the interpreter {path:?} is not an absolute path"));
                }
                Some(path)
            }
            None => None,
        };
        let mut needed = Vec::new();
        if let Some(dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) {
            let outside = "the dynamic section is outside the file";
            let mut names = Vec::new();
            let mut strtab = None;
            let end = dynamic.offset.checked_add(dynamic.filesz).ok_or(outside)?;
            let mut at = dynamic.offset;
            while at.checked_add(16).is_some_and(|e| e <= end) {
                let tag = u64_at(b, at).ok_or(outside)?;
                let val = u64_at(b, at + 8).ok_or(outside)?;
                match tag {
                    DT_NULL => break,
                    DT_NEEDED => names.push(val),
                    DT_STRTAB => strtab = Some(val),
                    _ => {}
                }
                if names.len() > MAX_ENTRIES {
                    return Err(format!("more than {MAX_ENTRIES} needed libraries"));
                }
                at += 16;
            }
            if !names.is_empty() {
                let vaddr = strtab.ok_or("needed libraries but no string table")?;
                let load = segments
                    .iter()
                    .find(|s| s.kind == PT_LOAD && s.vaddr <= vaddr && s.vaddr.checked_add(s.filesz).is_some_and(|e| vaddr < e))
                    .ok_or("the string table is in no loaded segment")?;
                let base = (vaddr - load.vaddr)
                    .checked_add(load.offset)
                    .ok_or("the string table is outside the file")?;
                for n in names {
                    let name = base
                        .checked_add(n)
                        .and_then(|at| c_string(b, at))
                        .ok_or("a needed library's name is outside the file")?;
                    if name.contains('/') || name.is_empty() || name == ".." {
                        return Err(format!("needs the library {name:?}, a path; only names are supported"));
                    }
                    if !needed.contains(&name) {
                        needed.push(name);
                    }
                }
            }
        }
        Ok(Elf { arch, interpreter, needed })
    }

    #[cfg(test)]
    mod tests {
        /// Hostile headers are refused, never a panic: offsets past the
        /// end, sizes that overflow.
        #[test]
        fn hostile_headers_are_refused_without_a_panic() -> Result<(), String> {
            let mut b = vec![0u8; 64];
            b[..6].copy_from_slice(b"\x7fELF\x02\x01");
            b[18] = 62;
            for (phoff, phentsize, phnum) in [(u64::MAX, 56u16, 1u16), (64, u16::MAX, 2), (u64::MAX - 7, 56, 3)] {
                b[32..40].copy_from_slice(&phoff.to_le_bytes());
                b[54..56].copy_from_slice(&phentsize.to_le_bytes());
                b[56..58].copy_from_slice(&phnum.to_le_bytes());
                assert!(super::read(&b).is_err());
            }
            b[56..58].copy_from_slice(&0u16.to_le_bytes());
            let elf = super::read(&b)?;
            assert!(elf.interpreter.is_none() && elf.needed.is_empty());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test program as `kubexm`, with `kubexm-install` beside it.
    type Res = Result<(), Box<dyn std::error::Error>>;

    fn own(dir: &Path) -> Result<Binary, Box<dyn std::error::Error>> {
        let exe = std::env::current_exe()?;
        for name in ["kubexm", "kubexm-install"] {
            let link = dir.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(&exe, &link)?;
            }
        }
        Ok(Binary {
            arch: own_arch().unwrap_or("amd64").into(),
            path: dir.join("kubexm"),
        })
    }

    #[test]
    fn this_test_program_s_libraries_are_found_where_the_loader_looks() -> Res {
        let dir = tempfile::tempdir()?;
        let files = image_files(&own(dir.path())?, Path::new("/"))?;
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&BINARY_PATH) && paths.contains(&INSTALLER_PATH), "{paths:?}");
        assert!(paths.iter().any(|p| p.ends_with("/libc.so.6")), "{paths:?}");
        // The interpreter at the path the program names.
        let elf = elf::read(&fs_err::read(std::env::current_exe()?)?)?;
        let interp = elf.interpreter.ok_or("no interpreter")?;
        assert!(paths.contains(&interp.as_str()), "{paths:?}");
        assert!(files.iter().all(|f| f.from.is_file()));
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
        Ok(())
    }

    #[test]
    fn a_wrong_arch_a_missing_library_and_a_non_elf_file_are_refused_by_name() -> Res {
        let dir = tempfile::tempdir()?;
        let mut b = own(dir.path())?;
        b.arch = if b.arch == "amd64" { "arm64".into() } else { "amd64".into() };
        let e = image_files(&b, Path::new("/")).err().ok_or("no error")?.to_string();
        assert!(e.contains("program, given for"), "{e}");
        // An empty root has none of the libraries.
        let root = tempfile::tempdir()?;
        let e = image_files(&own(dir.path())?, root.path()).err().ok_or("no error")?.to_string();
        assert!(e.contains("libc.so.6") || e.contains("needs"), "{e}");
        assert!(e.contains("apt-get install libc6:"), "{e}");
        let text = root.path().join("kubexm");
        fs_err::write(&text, "#!/bin/sh\n")?;
        let e = image_files(
            &Binary {
                arch: "amd64".into(),
                path: text.clone(),
            },
            Path::new("/"),
        )
        .err()
        .ok_or("no error")?
        .to_string();
        assert!(e.contains("kubexm-install is missing"), "{e}");
        fs_err::write(root.path().join("kubexm-install"), "#!/bin/sh\n")?;
        let e = image_files(
            &Binary {
                arch: "amd64".into(),
                path: text,
            },
            Path::new("/"),
        )
        .err()
        .ok_or("no error")?
        .to_string();
        assert!(e.contains("not an ELF program"), "{e}");
        Ok(())
    }

    #[test]
    fn flags_name_an_arch_and_a_file() -> Res {
        let exe = std::env::current_exe()?;
        let b = binaries(&[format!("arm64={}", exe.display())])?;
        assert!(b.contains(&Binary {
            arch: "arm64".into(),
            path: exe.clone()
        }));
        let e = binaries(&["arm64=/nonexistent/kubexm".into()]).err().ok_or("no error")?.to_string();
        assert!(e.contains("/nonexistent/kubexm: no such file"), "{e}");
        for bad in ["arm64", "riscv64=/x", "amd64="] {
            assert!(binaries(&[bad.into()]).is_err(), "{bad}");
        }
        Ok(())
    }

    fn item(platforms: &[&str]) -> ImageItem {
        ImageItem {
            reference: kubexm_bom::image::controller_image(),
            source: None,
            platforms: platforms.iter().map(|p| p.to_string()).collect(),
            digest: None,
            upstream_digest: None,
            platform_manifests: Default::default(),
            from_manifest: None,
        }
    }

    #[test]
    fn the_image_is_reproducible_and_lists_only_platforms_with_a_binary() -> Res {
        let dir = tempfile::tempdir()?;
        let cache = Cache::open(&dir.path().join("cache"))?;
        let binaries = vec![own(dir.path())?];
        let platform = format!("linux/{}", binaries[0].arch);
        let (a, platforms) = build(&cache, &item(&[&platform, "linux/riscv64"]), &binaries)?;
        assert_eq!(platforms, vec![platform.clone()]);
        // Packed again from nothing: the same digests.
        let dir2 = tempfile::tempdir()?;
        let (b, _) = build(&Cache::open(dir2.path())?, &item(&[&platform]), &binaries)?;
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.blobs, b.blobs);
        assert!(a.blobs.iter().all(|h| cache.has(h)));
        // The index names the platform's manifest, whose layer is a tar of the files.
        let index: serde_json::Value = serde_json::from_slice(&cache.read(a.digest.trim_start_matches("sha256:"))?)?;
        assert_eq!(index["manifests"][0]["platform"]["architecture"], binaries[0].arch);
        let manifest_hex = index["manifests"][0]["digest"]
            .as_str()
            .ok_or("no digest")?
            .trim_start_matches("sha256:");
        let manifest: serde_json::Value = serde_json::from_slice(&cache.read(manifest_hex)?)?;
        let layer_hex = manifest["layers"][0]["digest"]
            .as_str()
            .ok_or("no digest")?
            .trim_start_matches("sha256:");
        let mut archive = tar::Archive::new(fs_err::File::open(cache.blob(layer_hex))?);
        let mut names = Vec::new();
        for e in archive.entries()? {
            names.push(e?.path()?.display().to_string());
        }
        assert!(names.contains(&"usr/local/bin/kubexm".to_string()), "{names:?}");
        assert!(names.contains(&"usr/local/bin/kubexm-install".to_string()), "{names:?}");
        assert!(names.contains(&"tmp/".to_string()), "{names:?}");
        assert!(names.iter().any(|n| n.ends_with("/libc.so.6")), "{names:?}");
        // No platform with a binary: named.
        let e = build(&cache, &item(&["linux/riscv64"]), &binaries)
            .err()
            .ok_or("no error")?
            .to_string();
        assert!(e.contains("--controller-binary"), "{e}");
        let missing = vec![Binary {
            arch: binaries[0].arch.clone(),
            path: dir.path().join("missing/kubexm"),
        }];
        let e = build(&cache, &item(&[&platform]), &missing).err().ok_or("no error")?.to_string();
        assert!(e.contains("is missing"), "{e}");
        Ok(())
    }
}
