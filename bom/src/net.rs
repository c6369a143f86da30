//! IP addresses and CIDRs, just enough to check overlaps.

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

#[cfg(test)]
mod tests {
    use super::*;

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
