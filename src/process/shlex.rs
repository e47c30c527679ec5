//! Python's `shlex.split(s)` (POSIX mode, no comments), so a command string becomes the
//! same argument vector it does in the reference server. Nothing here is a shell: quotes
//! and backslashes group and escape characters, and `|`, `>`, `$HOME` stay literal text.
//!
//! The rules, as CPython's `shlex` applies them with `whitespace_split = True`:
//! - space, tab, CR and LF separate words; other characters (any Unicode) are word text;
//! - `'...'` keeps everything literally;
//! - `"..."` keeps everything literally except `\"` and `\\`, which lose the backslash;
//! - outside quotes a backslash takes the next character literally;
//! - quoted parts join the text around them (`a'b c'd` is one word `ab cd`), and `''`
//!   alone is an empty word.

/// Why a command could not be split: Python's `ValueError` message, word for word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitError(pub &'static str);

impl std::fmt::Display for SplitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Splits `command` into words exactly as `shlex.split(command)` does.
pub fn split(command: &str) -> Result<Vec<String>, SplitError> {
    #[derive(PartialEq)]
    enum State {
        Between,
        Word,
        Single,
        Double,
    }
    let mut words = Vec::new();
    let mut word = String::new();
    let mut state = State::Between;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match state {
            State::Between | State::Word => match c {
                ' ' | '\t' | '\r' | '\n' => {
                    if state == State::Word {
                        words.push(std::mem::take(&mut word));
                        state = State::Between;
                    }
                }
                '\'' => state = State::Single,
                '"' => state = State::Double,
                '\\' => {
                    word.push(chars.next().ok_or(SplitError("No escaped character"))?);
                    state = State::Word;
                }
                _ => {
                    word.push(c);
                    state = State::Word;
                }
            },
            State::Single => match c {
                '\'' => state = State::Word,
                _ => word.push(c),
            },
            State::Double => match c {
                '"' => state = State::Word,
                '\\' => {
                    let next = chars.next().ok_or(SplitError("No escaped character"))?;
                    if next != '"' && next != '\\' {
                        word.push('\\');
                    }
                    word.push(next);
                }
                _ => word.push(c),
            },
        }
    }
    match state {
        State::Single | State::Double => Err(SplitError("No closing quotation")),
        State::Word => {
            words.push(word);
            Ok(words)
        }
        State::Between => Ok(words),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CASES: &[&str] = &[
        "",
        "   ",
        "ls -la /tmp",
        "echo a | grep b > out.txt",
        "echo $HOME '$HOME' \"$HOME\"",
        "a'b c'd",
        "''",
        "'' \"\" x",
        r#""a \" b" 'c \' d"#,
        r#"echo "back\\slash" "keep\n" 'raw\n'"#,
        r"one\ word two\\three",
        "tab\tsep\nnewline\r\rcr",
        "bash -c 'echo hi; exit 3'",
        "héllo wörld 日本",
        "x\"y\"z'w'",
        "'unterminated",
        "\"unterminated",
        "trailing\\",
        "\"escape at end\\",
        "mid\\\"quote",
    ];

    /// Compares with the real `shlex.split` of the Python on this machine, so the two
    /// cannot drift apart silently.
    #[test]
    fn agrees_with_python_shlex() {
        let script = "import json, shlex, sys\n\
            out = []\n\
            for case in json.load(sys.stdin):\n\
            \x20   try: out.append({'ok': shlex.split(case)})\n\
            \x20   except ValueError as e: out.append({'err': str(e)})\n\
            print(json.dumps(out))";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 is needed for this test");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(serde_json::to_string(CASES).unwrap().as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        let python: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
        for (case, expected) in CASES.iter().zip(python) {
            let ours = match split(case) {
                Ok(words) => serde_json::json!({ "ok": words }),
                Err(e) => serde_json::json!({ "err": e.0 }),
            };
            assert_eq!(ours, expected, "shlex.split({case:?})");
        }
    }

    #[test]
    fn nothing_is_interpreted() {
        assert_eq!(
            split("echo a|b >c $X").unwrap(),
            ["echo", "a|b", ">c", "$X"]
        );
    }
}
