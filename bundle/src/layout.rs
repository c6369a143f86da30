//! The bundle's OCI image layout (`images/`), shared by all images and arches.
//!
//! Blobs are stored once under `images/blobs/sha256/`, whoever refers to
//! them. `images/index.json` names each image by its full upstream reference
//! in `org.opencontainers.image.ref.name` (the architecture's naming rule).

use serde::{Deserialize, Serialize};

pub const DIR: &str = "images";
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
pub const OCI_LAYOUT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Manifest media types kubexm reads and serves.
pub const MANIFEST_TYPES: &[&str] = &[OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST];

pub fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_LIST
}

/// Path of a blob inside the bundle.
pub fn blob_path(hex: &str) -> String {
    format!("{DIR}/blobs/sha256/{hex}")
}

/// A descriptor in `index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// `images/index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutIndex {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

impl LayoutIndex {
    /// An index naming each image by its full reference, sorted by name.
    pub fn new(mut images: Vec<(String, Descriptor)>) -> Self {
        images.sort_by(|a, b| a.0.cmp(&b.0));
        let manifests = images
            .into_iter()
            .map(|(name, mut d)| {
                d.annotations.insert(REF_NAME.to_string(), name);
                d
            })
            .collect();
        LayoutIndex {
            schema_version: 2,
            media_type: Some(OCI_INDEX.to_string()),
            manifests,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}
