//! The name a client speaks to, read from the first bytes of its connection: the SNI of a
//! TLS ClientHello or the Host header of an HTTP/1 request.

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// More bytes are needed.
    Incomplete,
    /// The connection names this host (lower case, no port, no trailing dot).
    Name(String),
    /// Complete, but names no host (TLS without SNI, HTTP without Host, not TLS or HTTP).
    Unnamed,
}

/// Largest prefix the proxy reads before deciding.
pub const MAX_PEEK: usize = 16 * 1024;

/// Judge the first bytes of a connection.
pub fn peek(buf: &[u8]) -> Peek {
    match buf.first() {
        None => Peek::Incomplete,
        Some(0x16) => tls_sni(buf),
        Some(_) => http_host(buf),
    }
}

fn be16(b: &[u8], i: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes([
        *b.get(i)?,
        *b.get(i + 1)?,
    ])))
}

fn tls_sni(buf: &[u8]) -> Peek {
    let Some(record_len) = be16(buf, 3) else {
        return Peek::Incomplete;
    };
    if buf.len() < 5 + record_len {
        return if buf.len() >= MAX_PEEK {
            Peek::Unnamed
        } else {
            Peek::Incomplete
        };
    }
    parse_client_hello(&buf[5..5 + record_len]).map_or(Peek::Unnamed, Peek::Name)
}

fn parse_client_hello(h: &[u8]) -> Option<String> {
    if *h.first()? != 0x01 {
        return None;
    }
    // type(1) length(3) version(2) random(32)
    let mut i = 4 + 2 + 32;
    i += 1 + usize::from(*h.get(i)?); // session id
    i += 2 + be16(h, i)?; // cipher suites
    i += 1 + usize::from(*h.get(i)?); // compression methods
    let ext_end = i + 2 + be16(h, i)?;
    i += 2;
    while i + 4 <= ext_end.min(h.len()) {
        let ty = be16(h, i)?;
        let len = be16(h, i + 2)?;
        let data = h.get(i + 4..i + 4 + len)?;
        if ty == 0 {
            // server_name_list: length(2), then entries type(1) length(2) name
            let mut j = 2;
            while j + 3 <= data.len() {
                let name_len = be16(data, j + 1)?;
                let name = data.get(j + 3..j + 3 + name_len)?;
                if data[j] == 0 {
                    return clean(std::str::from_utf8(name).ok()?);
                }
                j += 3 + name_len;
            }
            return None;
        }
        i += 4 + len;
    }
    None
}

fn http_host(buf: &[u8]) -> Peek {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= MAX_PEEK {
            Peek::Unnamed
        } else {
            Peek::Incomplete
        };
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    for line in head.split("\r\n").skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("host") {
                let v = v.trim();
                // Strip a port; IPv6 literals keep their brackets out.
                let host = if let Some(rest) = v.strip_prefix('[') {
                    rest.split(']').next().unwrap_or("")
                } else {
                    v.rsplit_once(':').map_or(v, |(h, p)| {
                        if p.bytes().all(|b| b.is_ascii_digit()) {
                            h
                        } else {
                            v
                        }
                    })
                };
                return clean(host).map_or(Peek::Unnamed, Peek::Name);
            }
        }
    }
    Peek::Unnamed
}

fn clean(s: &str) -> Option<String> {
    let n = s.trim().trim_end_matches('.').to_ascii_lowercase();
    (!n.is_empty()).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello carrying `name` as SNI.
    pub(crate) fn client_hello(name: &str) -> Vec<u8> {
        let mut sni = vec![0u8; 0];
        let n = name.as_bytes();
        let list_len = 3 + n.len();
        sni.extend_from_slice(&(list_len as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(n.len() as u16).to_be_bytes());
        sni.extend_from_slice(n);
        let mut ext = vec![0, 0];
        ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        ext.extend_from_slice(&sni);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn sni_and_host_are_read() {
        let hello = client_hello("Good.Test");
        assert_eq!(peek(&hello), Peek::Name("good.test".into()));
        assert_eq!(peek(&hello[..hello.len() - 1]), Peek::Incomplete);
        assert_eq!(
            peek(b"GET / HTTP/1.1\r\nHost: bad.test:8080\r\nX: y\r\n\r\n"),
            Peek::Name("bad.test".into())
        );
        assert_eq!(peek(b"GET / HTTP/1.1\r\nHost: a"), Peek::Incomplete);
        assert_eq!(peek(b"GET / HTTP/1.0\r\n\r\n"), Peek::Unnamed);
        for n in 0..hello.len() {
            let _ = peek(&hello[..n]);
        }
    }
}
