//! Listening TCP sockets from `/proc/net/tcp` and `/proc/net/tcp6`, with the process
//! that holds each one found through `/proc/<pid>/fd` (socket inodes), so no `ss` or
//! `netstat` is needed.

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

/// Every listening TCP socket of this network namespace. A table that cannot be read
/// (no IPv6) contributes nothing.
pub fn listening() -> Vec<Listening> {
    let mut found = Vec::new();
    for (path, protocol) in [("/proc/net/tcp", "tcp"), ("/proc/net/tcp6", "tcp6")] {
        if let Ok(text) = std::fs::read_to_string(path) {
            found.extend(parse_table(&text, protocol));
        }
    }
    found
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
