//! IP addresses and CIDRs, just enough to check overlaps; SSH host keys as a config pins them.

use std::net::IpAddr;

/// A parsed CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub v6: bool,
    /// The network address as a 128-bit number (IPv4 in the low 32 bits).
    network: u128,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, prefix) = s.split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        let (v6, bits, max) = match addr {
            IpAddr::V4(a) => (false, u32::from(a) as u128, 32),
            IpAddr::V6(a) => (true, u128::from(a), 128),
        };
        if prefix > max {
            return None;
        }
        let host_bits = max - prefix;
        let mask = if host_bits >= 128 { 0 } else { !((1u128 << host_bits) - 1) };
        let mask = if v6 { mask } else { mask & 0xffff_ffff };
        Some(Cidr {
            v6,
            network: bits & mask,
            prefix,
        })
    }

    fn max(&self) -> u8 {
        if self.v6 { 128 } else { 32 }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let (v6, bits) = match ip {
            IpAddr::V4(a) => (false, u32::from(a) as u128),
            IpAddr::V6(a) => (true, u128::from(a)),
        };
        if v6 != self.v6 {
            return false;
        }
        let host_bits = self.max() - self.prefix;
        if host_bits >= 128 {
            return true;
        }
        (bits >> host_bits) == (self.network >> host_bits)
    }

    pub fn overlaps(&self, other: &Cidr) -> bool {
        if self.v6 != other.v6 {
            return false;
        }
        let shorter = self.prefix.min(other.prefix);
        let host_bits = self.max() - shorter;
        host_bits >= 128 || (self.network >> host_bits) == (other.network >> host_bits)
    }
}

/// A DNS-1123 label: lowercase alphanumerics and '-', at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An IP address or a DNS name (labels of letters, digits and '-').
pub fn is_host_address(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok()
        || (!s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') && !l.starts_with('-')
            }))
}

/// The host key type a `hostKey` names: the one kubexm's SSH client
/// negotiates first, so the one a host presents when it has it.
const HOST_KEY_TYPE: &str = "ssh-ed25519";

/// An SSH public key given as `TYPE BASE64 [COMMENT]`, as `TYPE BASE64`
/// (how keys are pinned and compared): an `ssh-ed25519` key whose encoded
/// data names that same type. The messages never repeat the input.
pub fn host_key(s: &str) -> Result<String, String> {
    let mut fields = s.split_whitespace();
    let (Some(kind), Some(data)) = (fields.next(), fields.next()) else {
        return Err("it needs two fields, TYPE and BASE64".into());
    };
    if kind != HOST_KEY_TYPE {
        return Err(format!(
            "its type is not {HOST_KEY_TYPE} (kubexm checks the {HOST_KEY_TYPE} key a host presents: give the one in its \
             /etc/ssh/ssh_host_ed25519_key.pub)"
        ));
    }
    let bytes = base64_decode(data).ok_or("its second field is not base64")?;
    // The encoded key starts with its type: a 4-byte length, then the name.
    let named = bytes
        .get(..4)
        .map(|n| u32::from_be_bytes([n[0], n[1], n[2], n[3]]) as usize)
        .and_then(|n| bytes.get(4..4 + n));
    if named != Some(kind.as_bytes()) {
        return Err(format!("its data is not an {kind} key"));
    }
    Ok(format!("{kind} {data}"))
}

/// Standard base64 decoded (padding and whitespace ignored), or `None`:
/// a tiny decoder rather than a dependency (docker's `auth`, SSH keys).
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let bytes: Vec<u8> = s.bytes().filter(|b| *b != b'=' && !b.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let v: Vec<u8> = chunk.iter().map(|c| val(*c)).collect::<Option<_>>()?;
        let n = v.iter().fold(0u32, |acc, x| (acc << 6) | *x as u32) << (6 * (4 - v.len()));
        let take = v.len() * 6 / 8;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_keys_are_checked_and_normalized() -> Result<(), String> {
        let ed = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
        assert_eq!(host_key(&format!("{ed} root@lab1"))?, ed);
        assert!(host_key("ssh-ed25519").is_err());
        assert!(host_key("ssh-dss AAAAB3NzaC1kc3MAAACBAP").is_err());
        assert!(host_key("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7").is_err());
        assert!(host_key("ssh-ed25519 not*base64").is_err());
        assert_eq!(base64_decode("YTpiYw==").unwrap_or_default(), b"a:bc");
        assert!(base64_decode("!!").is_none());
        // An RSA key's data under the ed25519 type.
        let rsa = "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQC7";
        assert!(host_key(rsa).err().unwrap_or_default().contains("not an ssh-ed25519 key"));
        Ok(())
    }

    #[test]
    fn overlap_and_containment() {
        let svc = Cidr::parse("10.96.0.0/12").unwrap();
        let pod = Cidr::parse("10.244.0.0/16").unwrap();
        let bad = Cidr::parse("10.100.0.0/16").unwrap();
        assert!(!svc.overlaps(&pod));
        assert!(svc.overlaps(&bad) && bad.overlaps(&svc));
        assert!(svc.contains("10.97.1.1".parse().unwrap()));
        assert!(!svc.contains("10.112.0.1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("1.2.3.4".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8").unwrap().overlaps(&Cidr::parse("fd12::/64").unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_none());
    }
}
