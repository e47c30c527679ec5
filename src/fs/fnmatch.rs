//! Python's `fnmatch.fnmatch` on POSIX (case-sensitive): `*`, `?`, `[seq]`, `[!seq]`.

/// Whether `name` matches shell-style `pattern`.
pub fn fnmatch(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    // Where to resume after the most recent `*`: (pattern index after it, name index).
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p + 1, n));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(pattern, p, name[n]) {
                        if matched {
                            p = next;
                            n += 1;
                            continue;
                        }
                    } else if name[n] == b'[' {
                        // An unclosed `[` is a literal, as in Python.
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
                c if c == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                p = sp;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// Matches `c` against the class starting at `pattern[start] == b'['`. Returns whether it
/// matched and the index after the class, or `None` when the class is not closed.
fn class(pattern: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negated = matches!(pattern.get(i), Some(b'!'));
    if negated {
        i += 1;
    }
    let first = i;
    let mut matched = false;
    loop {
        let &ch = pattern.get(i)?;
        if ch == b']' && i > first {
            return Some((matched != negated, i + 1));
        }
        if pattern.get(i + 1) == Some(&b'-') && pattern.get(i + 2).is_some_and(|e| *e != b']') {
            let hi = pattern[i + 2];
            if ch <= c && c <= hi {
                matched = true;
            }
            i += 3;
        } else {
            if ch == c {
                matched = true;
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fnmatch;

    #[test]
    fn matches_like_python() {
        let cases: &[(&str, &str, bool)] = &[
            ("*.py", "a.py", true),
            ("*.py", "a.pyc", false),
            ("*.py", ".py", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("[ab]*", "bcd", true),
            ("[!ab]*", "bcd", false),
            ("[a-c]x", "bx", true),
            ("[a-c]x", "dx", false),
            ("*", "", true),
            ("[", "[", true),
            ("a[", "a[", true),
            ("[]]", "]", true),
            ("*a*b*", "xxaxxbxx", true),
            ("*a*b", "xxaxxbxxc", false),
            ("*.PY", "a.py", false),
            ("test_*.rs", "test_main.rs", true),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(
                fnmatch(pattern.as_bytes(), name.as_bytes()),
                *expected,
                "{pattern} ~ {name}"
            );
        }
    }
}
