//! Just enough of the DNS wire format (RFC 1035) for the resolver: the question of a query,
//! the A records of an answer, and NXDOMAIN/REFUSED replies.

use std::net::Ipv4Addr;

/// Query type A.
pub const TYPE_A: u16 = 1;
/// RCODE name error.
pub const RCODE_NXDOMAIN: u8 = 3;
/// RCODE refused.
pub const RCODE_REFUSED: u8 = 5;
/// RCODE server failure.
pub const RCODE_SERVFAIL: u8 = 2;

/// The question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Name asked for, lower case without the trailing dot.
    pub name: String,
    /// Query type.
    pub qtype: u16,
    /// Offset just past the question section.
    pub end: usize,
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

/// Skip a (possibly compressed) name starting at `i`; returns the offset after it.
fn skip_name(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let len = *b.get(i)?;
        if len & 0xC0 == 0xC0 {
            return Some(i + 2);
        }
        if len == 0 {
            return Some(i + 1);
        }
        i += 1 + usize::from(len);
    }
}

/// Parse the first question of a query (QR = 0, one question).
pub fn question(b: &[u8]) -> Option<Question> {
    if b.len() < 12 || b[2] & 0x80 != 0 || u16_at(b, 4)? != 1 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*b.get(i)?);
        if len == 0 {
            i += 1;
            break;
        }
        if len & 0xC0 != 0 || labels.len() > 127 {
            return None;
        }
        let label = b.get(i + 1..i + 1 + len)?;
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        i += 1 + len;
    }
    let qtype = u16_at(b, i)?;
    Some(Question {
        name: labels.join("."),
        qtype,
        end: i + 4,
    })
}

/// The response code of a reply.
pub fn rcode(b: &[u8]) -> Option<u8> {
    b.get(3).map(|f| f & 0x0F)
}

/// Every A record of a reply's answer section with its TTL.
pub fn answers_a(b: &[u8]) -> Option<Vec<(Ipv4Addr, u32)>> {
    let qd = u16_at(b, 4)?;
    let an = u16_at(b, 6)?;
    let mut i = 12;
    for _ in 0..qd {
        i = skip_name(b, i)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        i = skip_name(b, i)?;
        let rtype = u16_at(b, i)?;
        let ttl = u32::from_be_bytes(b.get(i + 4..i + 8)?.try_into().ok()?);
        let rdlen = usize::from(u16_at(b, i + 8)?);
        let rdata = b.get(i + 10..i + 10 + rdlen)?;
        if rtype == TYPE_A && rdlen == 4 {
            out.push((Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]), ttl));
        }
        i += 10 + rdlen;
    }
    Some(out)
}

/// A reply to `query` with `rcode` and no records (the question echoed).
pub fn reply_with(query: &[u8], q: &Question, rcode: u8) -> Vec<u8> {
    let mut r = query[..q.end.min(query.len())].to_vec();
    // QR=1, opcode and RD kept; RA=1; rcode.
    r[2] = 0x80 | (query[2] & 0x79);
    r[3] = 0x80 | rcode;
    // One question, nothing else.
    r[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    r
}

/// Whether an address must never be the answer for a filtered name (DNS rebinding):
/// private, loopback, link-local, shared, unspecified, multicast, broadcast.
pub fn is_internal(ip: Ipv4Addr) -> bool {
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || (ip.octets()[0] == 100 && (ip.octets()[1] & 0xC0) == 64)
}

/// A query for `name` of type `qtype` (for tests and probes).
pub fn build_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(32 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_and_answers_round_trip() {
        let q = build_query(7, "Good.Test", TYPE_A);
        let parsed = question(&q).unwrap();
        assert_eq!(parsed.name, "good.test");
        assert_eq!(parsed.qtype, TYPE_A);
        let mut r = reply_with(&q, &parsed, 0);
        r[7] = 1; // one answer
        r.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 20]);
        assert_eq!(
            answers_a(&r).unwrap(),
            vec![(Ipv4Addr::new(203, 0, 113, 20), 30)]
        );
        let nx = reply_with(&q, &parsed, RCODE_NXDOMAIN);
        assert_eq!(rcode(&nx), Some(RCODE_NXDOMAIN));
        assert_eq!(&nx[..2], &[0, 7]);
        assert!(question(&nx).is_none(), "a reply is not a query");
        assert!(is_internal(Ipv4Addr::new(10, 1, 1, 1)));
        assert!(is_internal(Ipv4Addr::new(169, 254, 169, 254)));
        assert!(!is_internal(Ipv4Addr::new(203, 0, 113, 20)));
    }

    #[test]
    fn truncated_input_is_rejected_not_panicking() {
        let q = build_query(1, "a.test", TYPE_A);
        for n in 0..q.len() {
            let _ = question(&q[..n]);
            let _ = answers_a(&q[..n]);
        }
    }
}
