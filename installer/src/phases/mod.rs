//! Deployment phases, one folder or file each; a mode is a file beside its
//! siblings (`endpoint/haproxy_keepalived.rs`, `endpoint/local_proxy.rs`).
//! (Moving the kubeadm and addon phases here from `kubeadm.rs` and
//! `addons.rs` is under way.)

pub mod containerd;
pub mod endpoint;
pub mod etcd;
pub mod registry;
