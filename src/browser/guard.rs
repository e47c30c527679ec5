//! Where a navigation may go: the policy's `url_allow` / `url_deny` globs and
//! `block_private_networks`, decided before Chromium sees the URL.
//!
//! The danger is a disagreement between this check and Chromium about which host a URL
//! names: a URL we read as a public name that Chromium reads as `127.0.0.1` walks past
//! the guard. So the host is taken the way the URL standard (and Chromium) takes it:
//! tabs and newlines removed, `\` read as `/` and any run of slashes skipped after an
//! `http:` scheme, userinfo cut at the last `@`, the host percent-decoded and lower-cased,
//! and a host that ends in a number parsed as an IPv4 address in every form the standard
//! accepts (`0x7f.1`, `2130706433`, `127.1`, `0177.0.0.1`). Names under `localhost` are
//! loopback in Chromium without any lookup. Every other name is resolved (off the event
//! loop, by the caller) and refused if any address it resolves to is private.
//!
//! What this does not cover, by the contract's design and said in `docs/api.md`:
//! redirects after the first URL, what the page loads afterwards (its scripts, frames and
//! fetches), and a name whose DNS answer changes between our lookup and Chromium's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::fs::fnmatch::fnmatch;

/// The parts of a URL the guard decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Lower-case scheme without the `:`.
    pub scheme: String,
    /// The host as Chromium will read it (lower case, percent-decoded, no brackets, no
    /// trailing dot), for schemes that have one.
    pub host: Option<String>,
    /// The port, explicit or the scheme's default.
    pub port: u16,
    /// Path and query (no fragment), `/` first, backslashes read as slashes.
    pub path: String,
}

/// Why the guard refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The URL is not one Chromium would open (400).
    Invalid(String),
    /// The policy forbids it (403 `url_not_allowed`).
    Denied(String),
}

/// What the guard needs before it can answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Allowed if every address `host` resolves to is public: the caller resolves it
    /// (blocking: on the pool) and calls [`check_resolved`].
    Resolve {
        host: String,
        port: u16,
    },
}

/// The schemes whose URLs have a host, with their default ports.
fn special_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        "ftp" => Some(21),
        _ => None,
    }
}

/// Splits `url` the way Chromium will. `Err` for text that is not an absolute URL.
pub fn parse_target(url: &str) -> Result<Target, String> {
    let cleaned: String = url
        .trim_matches(|c: char| c <= ' ')
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let Some((scheme, rest)) = cleaned.split_once(':') else {
        return Err(format!("{url:?} is not an absolute URL (it has no scheme)"));
    };
    let valid_scheme = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid_scheme {
        return Err(format!("{url:?} is not an absolute URL (bad scheme)"));
    }
    let scheme = scheme.to_ascii_lowercase();
    let Some(default_port) = special_port(&scheme) else {
        return Ok(Target {
            scheme,
            host: None,
            port: 0,
            path: String::new(),
        });
    };
    let after_slashes = rest.trim_start_matches(['/', '\\']);
    let authority_end = after_slashes
        .find(['/', '\\', '?', '#'])
        .unwrap_or(after_slashes.len());
    let authority = &after_slashes[..authority_end];
    let tail = after_slashes[authority_end..].replace('\\', "/");
    let tail = tail.split('#').next().unwrap_or("");
    let path = if tail.starts_with('/') {
        tail.to_string()
    } else {
        format!("/{tail}")
    };
    let host_port = match authority.rfind('@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    let (raw_host, port_text) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let Some((inside, after)) = bracketed.split_once(']') else {
            return Err(format!("{url:?} has an unclosed [ in its host"));
        };
        (format!("[{inside}]"), after.strip_prefix(':').unwrap_or(""))
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host.to_string(), port),
            None => (host_port.to_string(), ""),
        }
    };
    let port = if port_text.is_empty() {
        default_port
    } else {
        port_text
            .parse::<u16>()
            .map_err(|_| format!("{url:?} has a bad port {port_text:?}"))?
    };
    let decoded = percent_encoding::percent_decode_str(&raw_host)
        .decode_utf8()
        .map_err(|_| format!("{url:?} has a host that is not UTF-8"))?
        .to_lowercase();
    if decoded.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    let mut host = decoded
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .map(str::to_string)
        .unwrap_or_else(|| decoded.trim_end_matches('.').to_string());
    // One spelling per IPv4 address, so globs see `10.0.0.1` however it was written.
    if let Some(Ok(v4)) = parse_ipv4_host(&host) {
        host = v4.to_string();
    }
    Ok(Target {
        scheme,
        host: Some(host),
        port,
        path,
    })
}

/// Parses an IPv4 host the way the URL standard does: 1 to 4 dot-separated numbers in
/// decimal, octal (leading 0) or hex (0x), the last filling the remaining bytes.
/// `None` when the host is not a number form at all; `Err` when it ends in a number but
/// is not a valid address (Chromium refuses those URLs).
pub fn parse_ipv4_host(host: &str) -> Option<Result<Ipv4Addr, ()>> {
    let mut parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 1 && parts.last() == Some(&"") {
        parts.pop();
    }
    let number = |part: &str| -> Option<u64> {
        if part.is_empty() {
            return None;
        }
        let (digits, radix) = if let Some(hex) = part.strip_prefix("0x").or(part.strip_prefix("0X"))
        {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
        if digits.is_empty() {
            return Some(0);
        }
        u64::from_str_radix(digits, radix).ok()
    };
    // The standard's "ends in a number" test: only then is the host an IPv4 address.
    let last = parts.last()?;
    let ends_in_number = last.chars().all(|c| c.is_ascii_digit())
        || last
            .strip_prefix("0x")
            .or(last.strip_prefix("0X"))
            .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()));
    if !ends_in_number || last.is_empty() {
        return None;
    }
    if parts.len() > 4 {
        return Some(Err(()));
    }
    let mut numbers = Vec::with_capacity(parts.len());
    for part in &parts {
        match number(part) {
            Some(n) => numbers.push(n),
            None => return Some(Err(())),
        }
    }
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|&n| n > 255) || *last >= 256u64.pow(5 - numbers.len() as u32) {
        return Some(Err(()));
    }
    let mut value = *last;
    for (i, n) in leading.iter().enumerate() {
        value += n << (8 * (3 - i));
    }
    Some(Ok(Ipv4Addr::from(value as u32)))
}

/// Whether an address is anything but the public internet: loopback, RFC 1918,
/// link-local (the cloud metadata address 169.254.169.254 among them), carrier-grade
/// NAT (100.64/10), unique-local (fc00::/7), unspecified, multicast, reserved and
/// documentation ranges, and IPv6 forms that carry an IPv4 address (mapped, compatible,
/// NAT64, 6to4) whose IPv4 address is one of those.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => is_private_v6(v6),
    }
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0 // "this network": 0.0.0.0 reaches the local host on Linux
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b))
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || a >= 224 // multicast, reserved, broadcast
}

fn is_private_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let embedded_v4 =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return true;
    }
    match segments {
        // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated)
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0, 0, hi, lo] => {
            return is_private_v4(embedded_v4(hi, lo))
        }
        // NAT64 64:ff9b::a.b.c.d
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => return is_private_v4(embedded_v4(hi, lo)),
        // 6to4 2002:aabb:ccdd::
        [0x2002, hi, lo, ..] => return is_private_v4(embedded_v4(hi, lo)),
        _ => {}
    }
    let first = segments[0];
    (first & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (first == 0x2001 && segments[1] == 0x0db8) // documentation
        || (first == 0x0100 && segments[1..4] == [0, 0, 0]) // discard-only 100::/64
}

/// Whether `pattern` (a `url_allow` / `url_deny` glob) matches the URL. A pattern with
/// `://` is matched part by part against the URL as Chromium reads it: the scheme, the
/// host (with `:port` when the pattern names one), and the path with its query when the
/// pattern has one (`https://docs.rs/*`); any other pattern against the host alone
/// (`*.example.com`). Matching parts separately keeps `*` in a host pattern inside the
/// host: `https://*.example.com/*` does not match `https://evil.com/?.example.com/`.
pub fn pattern_matches(pattern: &str, target: &Target) -> bool {
    let Some(host) = target.host.as_deref() else {
        return false;
    };
    host_spellings(host)
        .iter()
        .any(|spelling| pattern_matches_host(pattern, target, spelling))
}

/// Every spelling a glob may name the host by, so one address cannot slip past a list
/// in another form: the host itself; for an IPv6 address that carries an IPv4 one
/// (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`), that IPv4 address and the IPv6
/// address in its usual text form; for loopback in any spelling (`localhost`,
/// `*.localhost`, 127.0.0.0/8, `::1`, their mapped forms), `localhost`, `127.0.0.1`
/// and `::1` as well.
fn host_spellings(host: &str) -> Vec<String> {
    let mut spellings = vec![host.to_string()];
    let mut ip: Option<IpAddr> = None;
    if let Ok(v6) = host.parse::<Ipv6Addr>() {
        spellings.push(v6.to_string());
        let [a, b, c, d, e, f, hi, lo] = v6.segments();
        let embeds_v4 = [a, b, c, d, e] == [0; 5] && (f == 0xffff || (f == 0 && hi != 0));
        ip = Some(if embeds_v4 {
            let v4 = Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
            spellings.push(v4.to_string());
            IpAddr::V4(v4)
        } else {
            IpAddr::V6(v6)
        });
    } else if let Ok(v4) = host.parse::<Ipv4Addr>() {
        ip = Some(IpAddr::V4(v4));
    }
    // 0.0.0.0 and [::] reach this machine too on Linux.
    let loopback = ip.is_some_and(|ip| ip.is_loopback() || ip.is_unspecified())
        || host == "localhost"
        || host.ends_with(".localhost");
    if loopback {
        spellings.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
    }
    spellings.dedup();
    spellings
}

fn pattern_matches_host(pattern: &str, target: &Target, host: &str) -> bool {
    let glob = |p: &str, text: &str| fnmatch(p.to_ascii_lowercase().as_bytes(), text.as_bytes());
    let Some((scheme, rest)) = pattern.split_once("://") else {
        return glob(pattern.trim_end_matches('.'), host);
    };
    if !glob(scheme, &target.scheme) {
        return false;
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    let bracketed = |h: &str| {
        if h.contains(':') {
            format!("[{h}]")
        } else {
            h.to_string()
        }
    };
    let names_port = authority
        .rsplit_once(']')
        .map_or(authority, |(_, after)| after)
        .contains(':');
    let host_matches = if names_port {
        glob(authority, &format!("{}:{}", bracketed(host), target.port))
    } else {
        glob(authority, &bracketed(host)) || glob(authority, host)
    };
    host_matches && path.is_none_or(|p| fnmatch(p.as_bytes(), target.path.as_bytes()))
}

/// The policy's answer for `url`, short of DNS.
pub fn check(
    url: &str,
    allow: Option<&[&str]>,
    deny: Option<&[&str]>,
    block_private_networks: bool,
) -> Result<Verdict, Refusal> {
    let target = parse_target(url);
    let lists = allow.is_some() || deny.is_some_and(|d| !d.is_empty());
    if lists {
        if let Ok(Target {
            host: Some(host), ..
        }) = &target
        {
            if !host.is_ascii() {
                return Err(Refusal::Denied(format!(
                    "URL {url}: write the host {host} in its ASCII (punycode) form so url_allow and url_deny can be checked"
                )));
            }
        }
    }
    if let Ok(parsed) = &target {
        if let Some(pattern) = deny
            .unwrap_or_default()
            .iter()
            .find(|p| pattern_matches(p, parsed))
        {
            return Err(Refusal::Denied(format!(
                "URL {url} matches url_deny pattern {pattern:?}"
            )));
        }
    }
    if let Some(allow) = allow {
        let allowed = target
            .as_ref()
            .is_ok_and(|parsed| allow.iter().any(|p| pattern_matches(p, parsed)));
        if !allowed {
            return Err(Refusal::Denied(format!(
                "URL {url} matches no url_allow pattern (allowed: {})",
                allow.join(", ")
            )));
        }
    }
    if !block_private_networks {
        return Ok(Verdict::Allowed);
    }
    let target = target.map_err(Refusal::Invalid)?;
    let Some(host) = target.host else {
        // No host: only the empty page. `data:` is refused too: its markup can send the
        // page anywhere (a meta refresh to 169.254.169.254) with no further check.
        if url.trim().eq_ignore_ascii_case("about:blank") {
            return Ok(Verdict::Allowed);
        }
        return Err(Refusal::Denied(format!(
            "URL {url} is refused by block_private_networks: only http, https and about:blank may be opened ({}: could reach this machine)",
            target.scheme
        )));
    };
    let denied = |why: String| {
        Refusal::Denied(format!(
            "URL {url} is refused by block_private_networks: {why}"
        ))
    };
    if !matches!(target.scheme.as_str(), "http" | "https") {
        return Err(denied("only http and https URLs may name a host".into()));
    }
    if host == "localhost" || host.ends_with(".localhost") {
        return Err(denied(format!("{host} is this machine")));
    }
    if host.contains(':') {
        let ip = host.parse::<Ipv6Addr>().map_err(|_| {
            Refusal::Invalid(format!("URL {url} has an invalid IPv6 host [{host}]"))
        })?;
        if is_private(IpAddr::V6(ip)) {
            return Err(denied(format!("[{host}] is a private address")));
        }
    } else {
        match parse_ipv4_host(&host) {
            Some(Ok(v4)) if is_private(IpAddr::V4(v4)) => {
                return Err(denied(format!("{v4} is a private address")))
            }
            Some(Ok(_)) | None => {}
            Some(Err(())) => {
                return Err(Refusal::Invalid(format!(
                    "URL {url} has an invalid IPv4 host {host}"
                )))
            }
        }
        if !host.is_ascii() {
            return Err(denied(format!(
                "write the host {host} in its ASCII (punycode) form so it can be checked"
            )));
        }
    }
    // Names and public literals alike: the answer, and this machine's own addresses
    // (a public address of an interface reaches the sandbox itself), are checked next.
    Ok(Verdict::Resolve {
        host,
        port: target.port,
    })
}

/// The check every navigation passes unless the policy opens private networks
/// (`allow_private_networks: true`), as the reference server's always-on URL guard:
/// only `http` and `https` URLs with a host (and the empty page), and never a host
/// that is this machine by name (`localhost`, `*.localhost`) or a loopback, private,
/// link-local or otherwise non-public address written as a literal. Names are not
/// resolved here (`block_private_networks` does that).
pub fn check_default(url: &str) -> Result<(), Refusal> {
    if url.trim().eq_ignore_ascii_case("about:blank") {
        return Ok(());
    }
    let invalid = || {
        Refusal::Invalid(format!(
            "URL {url} cannot be opened: only http and https URLs with a host are (policy allow_private_networks: true opens others)"
        ))
    };
    let target = parse_target(url).map_err(|_| invalid())?;
    let Some(host) = target.host else {
        return Err(invalid());
    };
    if !matches!(target.scheme.as_str(), "http" | "https") {
        return Err(invalid());
    }
    let private = |what: String| {
        Refusal::Denied(format!(
            "URL {url}: {what}; loopback, link-local and private addresses are not allowed (policy allow_private_networks: true allows them)"
        ))
    };
    if host == "localhost" || host.ends_with(".localhost") {
        return Err(private(format!("{host} is this machine")));
    }
    let literal = if host.contains(':') {
        host.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
    } else {
        match parse_ipv4_host(&host) {
            Some(Ok(v4)) => Some(IpAddr::V4(v4)),
            Some(Err(())) => return Err(invalid()),
            None => None,
        }
    };
    match literal {
        Some(ip) if is_private(ip) => Err(private(format!("{ip} is not a public address"))),
        _ => Ok(()),
    }
}

/// The answer for a host once resolved: refused if any address is private or belongs
/// to this machine (Chromium may pick any of them).
pub fn check_resolved(
    url: &str,
    host: &str,
    addresses: &[IpAddr],
    local: &[IpAddr],
) -> Result<(), String> {
    let refused = |why: String| {
        Err(format!(
            "URL {url} is refused by block_private_networks: {why}"
        ))
    };
    if let Some(ip) = addresses.iter().find(|ip| is_private(**ip)) {
        return refused(format!("{host} is {ip}, a private address"));
    }
    if let Some(ip) = addresses.iter().find(|ip| local.contains(ip)) {
        return refused(format!("{host} is {ip}, an address of this machine"));
    }
    if addresses.is_empty() {
        return refused(format!("{host} resolves to no address"));
    }
    Ok(())
}

/// This machine's interface addresses. Blocking (a netlink round trip): call it on the
/// pool.
pub fn local_addresses() -> Vec<IpAddr> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    interfaces
        .filter_map(|interface| {
            let address = interface.address?;
            if let Some(v4) = address.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> IpAddr {
        IpAddr::V4(s.parse().unwrap())
    }

    #[test]
    fn the_default_check_is_the_references() {
        for url in [
            "http://127.0.0.1:8080/",
            "http://[::1]/",
            "http://localhost/",
            "http://app.localhost/",
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/",
            "http://[::ffff:192.168.1.1]/",
            "http://2130706433/",
        ] {
            assert!(
                matches!(check_default(url), Err(Refusal::Denied(_))),
                "{url}"
            );
        }
        for url in [
            "file:///etc/passwd",
            "data:text/html,x",
            "javascript:alert(1)",
            "not a url",
            "ftp://example.com/",
        ] {
            assert!(
                matches!(check_default(url), Err(Refusal::Invalid(_))),
                "{url}"
            );
        }
        for url in [
            "https://example.com/",
            "http://8.8.8.8/",
            "about:blank",
            "https://docs.rs/serde",
        ] {
            assert_eq!(check_default(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn the_private_ranges_are_private() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "198.18.0.1",
        ] {
            assert!(is_private(v4(ip)), "{ip}");
        }
        for ip in [
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "::ffff:169.254.169.254",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn public_addresses_are_not() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "93.184.216.34",
            "169.255.0.1",
        ] {
            assert!(!is_private(v4(ip)), "{ip}");
        }
        for ip in [
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "2002:0808:0808::",
            "64:ff9b::808:808",
        ] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn ipv4_hosts_parse_in_every_standard_form() {
        let ok = |s: &str| parse_ipv4_host(s).unwrap().unwrap().to_string();
        assert_eq!(ok("127.0.0.1"), "127.0.0.1");
        assert_eq!(ok("2130706433"), "127.0.0.1");
        assert_eq!(ok("0x7f.1"), "127.0.0.1");
        assert_eq!(ok("0177.0.0.1"), "127.0.0.1");
        assert_eq!(ok("127.1"), "127.0.0.1");
        assert_eq!(ok("127.0.1"), "127.0.0.1");
        assert_eq!(ok("0x7f000001"), "127.0.0.1");
        assert_eq!(ok("169.254.43518"), "169.254.169.254");
        assert_eq!(ok("10.0.0.1."), "10.0.0.1");
        assert_eq!(parse_ipv4_host("example.com"), None);
        assert_eq!(parse_ipv4_host("1.2.3.4.5"), Some(Err(())));
        assert_eq!(parse_ipv4_host("256.0.0.1"), Some(Err(())));
        assert_eq!(parse_ipv4_host("4294967296"), Some(Err(())));
    }

    #[test]
    fn hosts_are_read_as_chromium_reads_them() {
        let host = |u: &str| parse_target(u).unwrap().host.unwrap();
        assert_eq!(host("http://user:pw@Example.COM:8080/x"), "example.com");
        assert_eq!(host("http://evil.com@127.0.0.1/"), "127.0.0.1");
        assert_eq!(host("http:\\\\127.0.0.1\\x"), "127.0.0.1");
        assert_eq!(host("http:/127.0.0.1/"), "127.0.0.1");
        assert_eq!(host("http://127.0.0.%31/"), "127.0.0.1");
        assert_eq!(host("http://[::1]:9000/"), "::1");
        assert_eq!(host("  http://loc\talhost./  "), "localhost");
        assert_eq!(parse_target("http://x:99/").unwrap().port, 99);
        assert_eq!(parse_target("https://x/").unwrap().port, 443);
        assert_eq!(parse_target("file:///etc/passwd").unwrap().host, None);
        assert!(parse_target("/relative").is_err());
        assert!(parse_target("http://x:99999/").is_err());
    }

    #[test]
    fn block_private_networks_refuses_every_spelling_of_this_machine() {
        for url in [
            "http://127.0.0.1:8080/",
            "http://[::1]/",
            "http://0.0.0.0/",
            "http://[::]/",
            "http://localhost/",
            "http://LOCALHOST./",
            "http://app.localhost/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://user@10.0.0.1/",
            "http:\\\\192.168.0.1",
            "file:///etc/passwd",
            "chrome://version",
            "ftp://8.8.8.8/",
            "http://[fe80::1]/",
            "http://[::1/",
        ] {
            assert!(
                check(url, None, None, true).is_err(),
                "{url} was let through"
            );
        }
    }

    #[test]
    fn public_hosts_are_resolved_and_checked_against_this_machine() {
        assert_eq!(
            check("http://8.8.8.8/", None, None, true),
            Ok(Verdict::Resolve {
                host: "8.8.8.8".into(),
                port: 80
            })
        );
        assert_eq!(check("about:blank", None, None, true), Ok(Verdict::Allowed));
        assert!(matches!(
            check(
                "data:text/html,<meta http-equiv=refresh content='0;url=http://10.0.0.1/'>",
                None,
                None,
                true
            ),
            Err(Refusal::Denied(_))
        ));
        assert_eq!(
            check("https://Example.com/a", None, None, true),
            Ok(Verdict::Resolve {
                host: "example.com".into(),
                port: 443
            })
        );
        assert!(check("http://exämple.com/", None, None, true).is_err());
        assert!(matches!(
            check("not a url", None, None, true),
            Err(Refusal::Invalid(_))
        ));
        assert_eq!(
            check("http://127.0.0.1/", None, None, false),
            Ok(Verdict::Allowed)
        );
        let none: [IpAddr; 0] = [];
        assert!(check_resolved("u", "h", &[v4("8.8.8.8"), v4("10.0.0.1")], &none).is_err());
        assert!(check_resolved("u", "h", &[], &none).is_err());
        assert!(check_resolved("u", "h", &[v4("8.8.8.8")], &none).is_ok());
        let mine =
            check_resolved("u", "h", &[v4("203.0.114.7")], &[v4("203.0.114.7")]).unwrap_err();
        assert!(mine.contains("this machine"), "{mine}");
        assert!(local_addresses().iter().any(|ip| ip.is_loopback()));
    }

    #[test]
    fn allow_and_deny_globs_match_hosts_or_whole_urls() {
        let allow = ["*.example.com", "https://docs.rs/*"];
        assert!(check("https://a.example.com/x", Some(&allow), None, false).is_ok());
        assert!(check("https://docs.rs/serde", Some(&allow), None, false).is_ok());
        assert!(check("http://docs.rs/serde", Some(&allow), None, false).is_err());
        assert!(check("https://example.org/", Some(&allow), None, false).is_err());
        let deny = ["*.internal"];
        let refused = check("http://db.internal/", None, Some(&deny), false).unwrap_err();
        assert!(
            matches!(&refused, Refusal::Denied(m) if m.contains("url_deny")),
            "{refused:?}"
        );
        assert!(check("http://A.Example.COM/", Some(&allow), Some(&deny), false).is_ok());
    }

    #[test]
    fn ipv4_in_ipv6_and_localhost_names_match_as_their_ipv4() {
        let deny = ["127.0.0.1"];
        for url in [
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::127.0.0.1]/",
            "http://[::1]/",
            "http://0.0.0.0/",
            "http://[::]/",
            "http://localhost/",
            "http://app.localhost:8080/",
            "http://127.1/",
        ] {
            assert!(
                matches!(
                    check(url, None, Some(&deny), false),
                    Err(Refusal::Denied(_))
                ),
                "{url} passed url_deny 127.0.0.1"
            );
        }
        let deny = ["10.0.0.*"];
        assert!(check("http://[::ffff:10.0.0.5]/", None, Some(&deny), false).is_err());
        assert!(check("http://[::ffff:10.0.1.5]/", None, Some(&deny), false).is_ok());
        let deny = ["localhost"];
        assert!(check("http://[::ffff:127.0.0.1]/", None, Some(&deny), false).is_err());
        assert!(check("http://example.com/", None, Some(&deny), false).is_ok());
        // Private-network checks already read mapped and localhost forms as loopback.
        for url in [
            "http://[::ffff:127.0.0.1]/",
            "http://[::127.0.0.1]/",
            "http://x.localhost/",
        ] {
            assert!(check(url, None, None, true).is_err(), "{url}");
        }
    }

    #[test]
    fn globs_see_one_canonical_spelling() {
        let deny = ["https://intra.example.com/*", "10.*"];
        for url in [
            "HTTPS://intra.example.com/x",
            "https://intra.example.com:443/",
            "https://x@intra.example.com/",
            "https:intra.example.com",
            "https://intra.example.com./",
            "https://intra.exa\tmple.com/",
            "http://167772161/",
            "http://0xa.1/",
        ] {
            assert!(
                check(url, None, Some(&deny), false).is_err(),
                "{url} passed the deny list"
            );
        }
        let allow = ["https://*.example.com/*"];
        for url in [
            "https://evil.com?.example.com/",
            "https://evil.com#.example.com/",
            "https://evil.com/.example.com/",
        ] {
            assert!(
                check(url, Some(&allow), None, false).is_err(),
                "{url} passed the allow list"
            );
        }
        assert!(check("https://a.example.com/?q=1", Some(&allow), None, false).is_ok());
        let ported = ["http://127.0.0.1:8080/*"];
        assert!(check("http://127.0.0.1:8080/one", Some(&ported), None, false).is_ok());
        assert!(check("http://127.0.0.1:8081/one", Some(&ported), None, false).is_err());
        assert!(check(
            "http://db.ｉｎｔｅｒｎａｌ/",
            None,
            Some(&["*.internal"]),
            false
        )
        .is_err());
    }
}
