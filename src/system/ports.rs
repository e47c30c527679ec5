//! Listening TCP sockets, with the process that holds each one found through
//! `/proc/<pid>/fd` (socket inodes), so no `ss` or `netstat` is needed.
//!
//! The sockets come from the kernel's sock_diag netlink interface (what `ss` uses),
//! asked for listening sockets only: the kernel then walks only its listening hash.
//! `/proc/net/tcp` and `tcp6` are the fallback where netlink is refused; reading them
//! walks every bucket of the established-connection hash as well, which measured 6.6 ms
//! for two short tables on a 24 GiB machine (the hash is sized by memory).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `st` of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// One listening socket.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Listening {
    pub port: u16,
    /// `tcp` or `tcp6`, after the file it came from.
    pub protocol: &'static str,
    pub address: IpAddr,
    pub inode: u64,
}

/// Every listening TCP socket of this network namespace.
pub fn listening() -> Vec<Listening> {
    let mut found = Vec::new();
    let diag = [(libc::AF_INET, "tcp"), (libc::AF_INET6, "tcp6")]
        .into_iter()
        .try_for_each(|(family, protocol)| {
            found.extend(sock_diag_listening(family, protocol)?);
            Ok::<_, std::io::Error>(())
        });
    if diag.is_ok() {
        return found;
    }
    found.clear();
    for (path, protocol) in [("/proc/net/tcp", "tcp"), ("/proc/net/tcp6", "tcp6")] {
        if let Ok(text) = std::fs::read_to_string(path) {
            found.extend(parse_table(&text, protocol));
        }
    }
    found
}

/// `SOCK_DIAG_BY_FAMILY`, `TCP_LISTEN`, and the sizes of the netlink structures used
/// (`linux/inet_diag.h`): `nlmsghdr` 16 bytes, `inet_diag_req_v2` 56, `inet_diag_msg` 72.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_LISTEN_STATE: u32 = 10;
const NLMSG_HEADER: usize = 16;
const DIAG_REQUEST: usize = 56;
const DIAG_MESSAGE: usize = 72;

/// The listening TCP sockets of one address family, by an `inet_diag` dump.
fn sock_diag_listening(family: i32, protocol: &'static str) -> std::io::Result<Vec<Listening>> {
    use std::io::{Error, ErrorKind};
    // SAFETY: plain socket creation; the descriptor is owned right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut request = [0u8; NLMSG_HEADER + DIAG_REQUEST];
    request[0..4].copy_from_slice(&((NLMSG_HEADER + DIAG_REQUEST) as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    request[6..8].copy_from_slice(&flags.to_ne_bytes());
    request[16] = family as u8;
    request[17] = libc::IPPROTO_TCP as u8;
    request[20..24].copy_from_slice(&(1u32 << TCP_LISTEN_STATE).to_ne_bytes());
    rustix::net::send(&fd, &request, rustix::net::SendFlags::empty())?;
    let mut found = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let (n, _) = rustix::net::recv(&fd, &mut buffer[..], rustix::net::RecvFlags::empty())?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::UnexpectedEof,
                "sock_diag ended without NLMSG_DONE",
            ));
        }
        let mut offset = 0;
        while offset + NLMSG_HEADER <= n {
            let header = &buffer[offset..n];
            let length = u32::from_ne_bytes(header[0..4].try_into().unwrap_or_default()) as usize;
            let kind = u16::from_ne_bytes(header[4..6].try_into().unwrap_or_default());
            if length < NLMSG_HEADER || length > header.len() {
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    "a malformed netlink message",
                ));
            }
            match i32::from(kind) {
                libc::NLMSG_DONE => return Ok(found),
                libc::NLMSG_ERROR => {
                    let errno = header
                        .get(16..20)
                        .map(|b| i32::from_ne_bytes(b.try_into().unwrap_or_default()))
                        .unwrap_or(0);
                    return Err(Error::from_raw_os_error(
                        errno.checked_neg().unwrap_or(libc::EIO),
                    ));
                }
                _ if usize::from(kind) == usize::from(SOCK_DIAG_BY_FAMILY)
                    && length >= NLMSG_HEADER + DIAG_MESSAGE =>
                {
                    let message = &header[NLMSG_HEADER..NLMSG_HEADER + DIAG_MESSAGE];
                    if let Some(row) = parse_diag_message(message, protocol) {
                        found.push(row);
                    }
                }
                _ => {}
            }
            // Messages are aligned to 4 bytes.
            offset += (length + 3) & !3;
        }
    }
}

/// One `inet_diag_msg`: family, state, the socket id (source port big-endian, source
/// address in network order) and, at the end, the inode.
fn parse_diag_message(message: &[u8], protocol: &'static str) -> Option<Listening> {
    let family = i32::from(message[0]);
    let port = u16::from_be_bytes([message[4], message[5]]);
    let source = &message[8..24];
    let address = if family == libc::AF_INET {
        IpAddr::V4(Ipv4Addr::new(source[0], source[1], source[2], source[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(source).ok()?))
    };
    let inode = u32::from_ne_bytes(message[68..72].try_into().ok()?);
    Some(Listening {
        port,
        protocol,
        address,
        inode: u64::from(inode),
    })
}

/// The listening rows of one `/proc/net/tcp*` table.
pub fn parse_table(text: &str, protocol: &'static str) -> Vec<Listening> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(3) != Some(&TCP_LISTEN) {
                return None;
            }
            let (address, port) = fields.get(1)?.split_once(':')?;
            Some(Listening {
                port: u16::from_str_radix(port, 16).ok()?,
                protocol,
                address: parse_address(address)?,
                inode: fields.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The kernel prints an address as 32-bit words of network-order bytes read as
/// little-endian integers (this parser assumes a little-endian machine, as x86_64 and
/// aarch64 Linux are), in hex: `0100007F` is 127.0.0.1.
fn parse_address(hex: &str) -> Option<IpAddr> {
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(hex, 16).ok()?.to_le_bytes(),
        ))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                let value = u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).ok()?;
                bytes[i * 4..i * 4 + 4].copy_from_slice(&value.to_le_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

/// Which process holds each of `inodes`: the first pid (lowest) whose descriptor table
/// has it. Processes this server may not inspect are skipped, so their sockets stay
/// without a pid.
pub fn owners(inodes: &HashSet<u64>) -> HashMap<u64, i32> {
    let mut owners = HashMap::new();
    if inodes.is_empty() {
        return owners;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return owners;
    };
    let mut pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if inodes.contains(&inode) {
                owners.entry(inode).or_insert(pid);
            }
        }
        if owners.len() == inodes.len() {
            break;
        }
    }
    owners
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netlink_and_proc_agree() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let diag = sock_diag_listening(libc::AF_INET, "tcp").unwrap();
        let proc = parse_table(&std::fs::read_to_string("/proc/net/tcp").unwrap(), "tcp");
        let ours = |rows: &[Listening]| rows.iter().find(|r| r.port == port).cloned();
        assert!(ours(&diag).is_some(), "{diag:?}");
        assert_eq!(ours(&diag), ours(&proc));
        let owners = owners(&HashSet::from([ours(&diag).unwrap().inode]));
        assert_eq!(owners.values().next(), Some(&(std::process::id() as i32)));
    }

    #[test]
    fn tables_parse() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12346 1 0000000000000000 100 0 0 10 0\n\
   2: 0100007F:A1B2 0100007F:2328 01 00000000:00000000 00:00000000 00000000     0        0 12347 1 0000000000000000 100 0 0 10 0\n";
        let rows = parse_table(v4, "tcp");
        assert_eq!(rows.len(), 2, "only LISTEN rows");
        assert_eq!(
            (rows[0].port, rows[0].address, rows[0].inode),
            (9000, "0.0.0.0".parse().unwrap(), 12345)
        );
        assert_eq!(
            (rows[1].port, rows[1].address),
            (8081, "127.0.0.1".parse().unwrap())
        );
        let v6 = "  sl  local_address                         remote_address                        st\n\
   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1\n\
   1: 00000000000000000000000000000000:0051 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 556 1\n";
        let rows = parse_table(v6, "tcp6");
        assert_eq!(
            (rows[0].port, rows[0].address),
            (80, "::1".parse().unwrap())
        );
        assert_eq!((rows[1].port, rows[1].address), (81, "::".parse().unwrap()));
    }
}
