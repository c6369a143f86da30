//! Integration tests of kubexm-bom, in one binary.

mod bom;
mod hostile;
mod injection;
mod validation;

use kubexm_bom::catalog::Catalog;

pub fn catalog() -> Catalog {
    Catalog::builtin().expect("built-in catalog")
}

/// A small valid config every validation case edits one line of.
pub const BASE: &str = "\
apiVersion: kubexm.io/v1alpha1
kind: Cluster
metadata:
  name: t
spec:
  hostDefaults:
    auth: {agent: true}
  hosts:
    - {name: lb1, address: 10.0.0.5}
    - {name: cp1, address: 10.0.0.11}
    - {name: cp2, address: 10.0.0.12}
    - {name: cp3, address: 10.0.0.13}
  roleGroups:
    etcd: [cp1, cp2, cp3]
    control-plane: [cp1, cp2, cp3]
    loadbalancer: [lb1]
  controlPlaneEndpoint:
    mode: haproxy-keepalived
    address: 10.0.0.100
  kubernetes:
    version: v1.33.4
";
