//! Just enough of the DNS wire format (RFC 1035) for a policy-checking forwarder: the
//! question of a query, the A records of an answer, and error replies. Every read is
//! bounds-checked; compression pointers must point strictly backwards (no loops) and a
//! name is at most 255 bytes. Input comes from the sandbox (hostile) and from upstream.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const HEADER_LEN: usize = 12;
pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
pub const CLASS_IN: u16 = 1;
pub const RCODE_FORMERR: u8 = 1;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_NXDOMAIN: u8 = 3;
pub const RCODE_NOTIMP: u8 = 4;
pub const RCODE_REFUSED: u8 = 5;
const MAX_NAME: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message truncated")]
    Truncated,
    #[error("bad name")]
    BadName,
    #[error("not a single-question query")]
    NotAQuery,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Lowercase, dotted, no trailing dot (the root is "").
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    pub opcode: u8,
    pub question: Question,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: u16,
    pub rcode: u8,
    pub question: Question,
    /// A records of the answer section (any owner: CNAME chains end in them), with TTLs.
    pub addresses: Vec<(Ipv4Addr, u32)>,
    /// AAAA records of the answer section, likewise.
    pub addresses6: Vec<(Ipv6Addr, u32)>,
}

fn u16_at(buf: &[u8], at: usize) -> Result<u16, WireError> {
    let b = buf.get(at..at + 2).ok_or(WireError::Truncated)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

fn u32_at(buf: &[u8], at: usize) -> Result<u32, WireError> {
    let b = buf.get(at..at + 4).ok_or(WireError::Truncated)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Reads the name at `at`; returns it and the offset just past it (past the first pointer
/// if it is compressed). Labels holding bytes other than letters, digits, `-` and `_`
/// make it a [`WireError::BadName`]: no rule could match them, and refusing is safer than
/// escaping.
pub fn read_name(buf: &[u8], at: usize) -> Result<(String, usize), WireError> {
    let mut name = String::new();
    let mut pos = at;
    let mut end: Option<usize> = None;
    // Pointers must go strictly backwards, so this terminates; the name length bound
    // keeps it short anyway. And never into the header: no name lives there, and one read
    // from a query's header would read otherwise in the reply built from it (whose header
    // differs), so the name checked would not be the name answered (found by fuzzing).
    let mut lowest = at;
    loop {
        let len = *buf.get(pos).ok_or(WireError::Truncated)?;
        match len & 0xC0 {
            0x00 => {
                if len == 0 {
                    return Ok((name, end.unwrap_or(pos + 1)));
                }
                let label = buf
                    .get(pos + 1..pos + 1 + usize::from(len))
                    .ok_or(WireError::Truncated)?;
                if !label
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
                {
                    return Err(WireError::BadName);
                }
                if !name.is_empty() {
                    name.push('.');
                }
                name.extend(label.iter().map(|b| char::from(b.to_ascii_lowercase())));
                if name.len() > MAX_NAME {
                    return Err(WireError::BadName);
                }
                pos += 1 + usize::from(len);
            }
            0xC0 => {
                let target = usize::from(u16_at(buf, pos)? & 0x3FFF);
                if target >= lowest || target < HEADER_LEN {
                    return Err(WireError::BadName);
                }
                end.get_or_insert(pos + 2);
                lowest = target;
                pos = target;
            }
            _ => return Err(WireError::BadName),
        }
    }
}

fn read_question(buf: &[u8], at: usize) -> Result<(Question, usize), WireError> {
    let (name, pos) = read_name(buf, at)?;
    let qtype = u16_at(buf, pos)?;
    let qclass = u16_at(buf, pos + 2)?;
    Ok((
        Question {
            name,
            qtype,
            qclass,
        },
        pos + 4,
    ))
}

/// A query from a client: QR clear, exactly one question, nothing in answer/authority.
pub fn parse_query(buf: &[u8]) -> Result<Query, WireError> {
    if buf.len() < HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let id = u16_at(buf, 0)?;
    let flags = u16_at(buf, 2)?;
    if flags & 0x8000 != 0 || u16_at(buf, 4)? != 1 || u16_at(buf, 6)? != 0 || u16_at(buf, 8)? != 0 {
        return Err(WireError::NotAQuery);
    }
    let opcode = ((flags >> 11) & 0xF) as u8;
    let (question, _) = read_question(buf, HEADER_LEN)?;
    Ok(Query {
        id,
        opcode,
        question,
    })
}

/// An upstream answer: its question and A records.
pub fn parse_answer(buf: &[u8]) -> Result<Answer, WireError> {
    if buf.len() < HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let id = u16_at(buf, 0)?;
    let flags = u16_at(buf, 2)?;
    if flags & 0x8000 == 0 || u16_at(buf, 4)? != 1 {
        return Err(WireError::NotAQuery);
    }
    let rcode = (flags & 0xF) as u8;
    let ancount = u16_at(buf, 6)?;
    let (question, mut pos) = read_question(buf, HEADER_LEN)?;
    let mut addresses = Vec::new();
    let mut addresses6 = Vec::new();
    for _ in 0..ancount {
        let (_, after) = read_name(buf, pos)?;
        let rtype = u16_at(buf, after)?;
        let class = u16_at(buf, after + 2)?;
        let ttl = u32_at(buf, after + 4)?;
        let rdlen = usize::from(u16_at(buf, after + 8)?);
        let rdata = buf
            .get(after + 10..after + 10 + rdlen)
            .ok_or(WireError::Truncated)?;
        if rtype == TYPE_A && class == CLASS_IN && rdlen == 4 {
            addresses.push((Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]), ttl));
        }
        if rtype == TYPE_AAAA && class == CLASS_IN && rdlen == 16 {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(rdata);
            addresses6.push((Ipv6Addr::from(octets), ttl));
        }
        pos = after + 10 + rdlen;
    }
    Ok(Answer {
        id,
        rcode,
        question,
        addresses,
        addresses6,
    })
}

/// A reply to `query` (the client's bytes) with no records and `rcode`: its header and
/// question, QR and RA set. `None` if the query is too short to carry an id.
pub fn error_reply(query: &[u8], rcode: u8) -> Option<Vec<u8>> {
    if query.len() < HEADER_LEN {
        return None;
    }
    // Keep the question when it parses, else answer with the header alone.
    let qend = read_question(query, HEADER_LEN)
        .ok()
        .map(|(_, end)| end)
        .filter(|_| u16_at(query, 4).ok() == Some(1));
    let mut out = query[..qend.unwrap_or(HEADER_LEN)].to_vec();
    let opcode_rd = query[2] & 0x79; // opcode and RD from the query
    out[2] = 0x80 | opcode_rd;
    out[3] = 0x80 | (rcode & 0xF);
    out[4..6].copy_from_slice(&(u16::from(qend.is_some())).to_be_bytes());
    out[6..12].fill(0);
    Some(out)
}

/// A successful reply to `query` (its header and question) with one A record per address,
/// owner = the question's name (a compression pointer to it). `None` as for
/// [`error_reply`].
pub fn a_reply(query: &[u8], addresses: &[Ipv4Addr], ttl: u32) -> Option<Vec<u8>> {
    let mut out = error_reply(query, 0)?;
    // error_reply dropped an unparsable question: then there is nothing to answer.
    if u16_at(&out, 4).ok() != Some(1) {
        return Some(out);
    }
    out[2] |= 0x04; // AA: we are the authority for these names
    let count = u16::try_from(addresses.len()).ok()?;
    out[6..8].copy_from_slice(&count.to_be_bytes());
    for ip in addresses {
        out.extend_from_slice(&[0xC0, HEADER_LEN as u8]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&ip.octets());
    }
    Some(out)
}

/// A query for `name`/A with id `id`, recursion desired (for the proxy's own lookups and
/// tests).
pub fn build_query(id: u16, name: &str, qtype: u16) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(HEADER_LEN + name.len() + 6);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|l| (1..64).contains(l))?;
        out.push(len);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_with(records: &[u8], ancount: u16) -> Vec<u8> {
        let mut m = build_query(0x1234, "www.Example.com", TYPE_A).unwrap();
        m[2] = 0x81;
        m[3] = 0x80;
        m[6..8].copy_from_slice(&ancount.to_be_bytes());
        m.extend_from_slice(records);
        m
    }

    #[test]
    fn query_round_trip() {
        let q = build_query(7, "A.b-c.example", TYPE_A).unwrap();
        let p = parse_query(&q).unwrap();
        assert_eq!(p.id, 7);
        assert_eq!(p.question.name, "a.b-c.example");
        assert_eq!(p.question.qtype, TYPE_A);
    }

    #[test]
    fn answer_with_cname_and_compression() {
        // www.example.com CNAME cdn.example.com (pointer to offset 16 = "example.com"),
        // then cdn... A 1.2.3.4 (owner: pointer to the CNAME's rdata at offset 45)
        let mut r = vec![
            0xC0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 6, 3, b'c', b'd', b'n', 0xC0, 16,
        ];
        r.extend_from_slice(&[0xC0, 45, 0, 1, 0, 1, 0, 0, 1, 0, 0, 4, 1, 2, 3, 4]);
        let a = parse_answer(&answer_with(&r, 2)).unwrap();
        assert_eq!(a.question.name, "www.example.com");
        assert_eq!(a.addresses, vec![(Ipv4Addr::new(1, 2, 3, 4), 256)]);
    }

    #[test]
    fn pointer_loops_and_forward_pointers_are_refused() {
        let mut m = build_query(1, "x.com", TYPE_A).unwrap();
        m[2] = 0x81;
        m[7] = 1;
        // owner name pointing at itself
        let at = m.len() as u8;
        m.extend_from_slice(&[0xC0, at, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 1, 1, 1]);
        assert_eq!(parse_answer(&m), Err(WireError::BadName));
    }

    /// fuzz/ target dns_wire's first find: a question whose name points into the header
    /// parsed (as the root name), and the reply built from it, whose header differs, named
    /// something else.
    #[test]
    fn names_pointing_into_the_header_are_refused() {
        let query = [
            0x40, 0x07, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xC0, 0x07, 0x75, 0x3D, 0x62,
            0x04, 0x62, 0x61, 0x01,
        ];
        assert_eq!(parse_query(&query), Err(WireError::BadName));
        // Still answered (with the header alone), never with that question.
        let reply = error_reply(&query, 1).unwrap();
        assert_eq!(reply.len(), HEADER_LEN);
    }

    #[test]
    fn truncations_never_panic() {
        let full = answer_with(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 9, 9, 9, 9], 1);
        assert!(parse_answer(&full).is_ok());
        for n in 0..full.len() {
            let _ = parse_answer(&full[..n]);
            let _ = parse_query(&full[..n]);
            let _ = error_reply(&full[..n], RCODE_REFUSED);
        }
        // every single-byte corruption, too
        for i in 0..full.len() {
            for v in [0u8, 0x3F, 0x40, 0xC0, 0xFF] {
                let mut m = full.clone();
                m[i] = v;
                let _ = parse_answer(&m);
                let _ = parse_query(&m);
            }
        }
    }

    #[test]
    fn odd_labels_are_bad_names() {
        let mut q = build_query(1, "a.com", TYPE_A).unwrap();
        q[13] = b'.';
        assert_eq!(parse_query(&q), Err(WireError::BadName));
        let long = ["a"; 200].join(".");
        assert!(build_query(1, &long, TYPE_A).is_some());
        assert_eq!(
            parse_query(&build_query(1, &long, TYPE_A).unwrap()),
            Err(WireError::BadName)
        );
    }

    #[test]
    fn a_reply_parses_back() {
        let q = build_query(0x1234, "sc-abc", TYPE_A).unwrap();
        let r = a_reply(&q, &[Ipv4Addr::new(10, 200, 0, 6)], 5).unwrap();
        let a = parse_answer(&r).unwrap();
        assert_eq!(a.id, 0x1234);
        assert_eq!(a.rcode, 0);
        assert_eq!(a.question.name, "sc-abc");
        assert_eq!(a.addresses, vec![(Ipv4Addr::new(10, 200, 0, 6), 5)]);
    }

    #[test]
    fn error_reply_echoes_id_and_question() {
        let q = build_query(0xBEEF, "nope.test", TYPE_A).unwrap();
        let r = error_reply(&q, RCODE_NXDOMAIN).unwrap();
        assert_eq!(&r[..2], &[0xBE, 0xEF]);
        assert_eq!(r[2] & 0x80, 0x80);
        assert_eq!(r[3] & 0xF, RCODE_NXDOMAIN);
        let a = parse_answer(&r).unwrap();
        assert_eq!(a.question.name, "nope.test");
        assert!(a.addresses.is_empty());
    }
}
