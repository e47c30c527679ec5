//! Key names as Playwright spells them (`Enter`, `Control+A`, `Shift+ArrowLeft`), turned
//! into the fields Chromium's `Input.dispatchKeyEvent` needs. A page's listeners read
//! `key`, `code` and `keyCode`, and Chromium only runs a key's default action (submit a
//! form on Enter, select all on Control+A) when the virtual key code is right, so each
//! named key carries all three.

/// `Input.dispatchKeyEvent`'s modifier bits.
pub const ALT: u32 = 1;
pub const CONTROL: u32 = 2;
pub const META: u32 = 4;
pub const SHIFT: u32 = 8;

/// One key as Chromium wants it described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// `KeyboardEvent.key`: `Enter`, `a`, `A`.
    pub key: String,
    /// `KeyboardEvent.code`: `Enter`, `KeyA` (empty when no physical key types it).
    pub code: String,
    /// Windows virtual key code (`keyCode`): 13 for Enter, 65 for A.
    pub key_code: u32,
    /// What the key types, if anything (`\r` for Enter).
    pub text: Option<String>,
}

/// A key pressed with modifiers held: `Control+Shift+Z`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chord {
    /// The modifier keys, pressed in order and released in reverse.
    pub modifiers: Vec<Key>,
    /// Their `Input.dispatchKeyEvent` bits, or-ed.
    pub modifier_bits: u32,
    pub key: Key,
}

/// Named keys: (name, code, key code, text).
const NAMED: [(&str, &str, u32, Option<&str>); 24] = [
    ("Enter", "Enter", 13, Some("\r")),
    ("Tab", "Tab", 9, Some("\t")),
    ("Backspace", "Backspace", 8, None),
    ("Delete", "Delete", 46, None),
    ("Escape", "Escape", 27, None),
    ("ArrowUp", "ArrowUp", 38, None),
    ("ArrowDown", "ArrowDown", 40, None),
    ("ArrowLeft", "ArrowLeft", 37, None),
    ("ArrowRight", "ArrowRight", 39, None),
    ("Home", "Home", 36, None),
    ("End", "End", 35, None),
    ("PageUp", "PageUp", 33, None),
    ("PageDown", "PageDown", 34, None),
    ("Insert", "Insert", 45, None),
    ("Space", "Space", 32, Some(" ")),
    ("CapsLock", "CapsLock", 20, None),
    ("ContextMenu", "ContextMenu", 93, None),
    ("Pause", "Pause", 19, None),
    ("PrintScreen", "PrintScreen", 44, None),
    ("ScrollLock", "ScrollLock", 145, None),
    ("NumLock", "NumLock", 144, None),
    ("AudioVolumeMute", "AudioVolumeMute", 173, None),
    ("AudioVolumeDown", "AudioVolumeDown", 174, None),
    ("AudioVolumeUp", "AudioVolumeUp", 175, None),
];

/// Modifier names (Playwright's, plus common spellings): (name, key, code, key code, bit).
const MODIFIERS: [(&str, &str, &str, u32, u32); 8] = [
    ("Control", "Control", "ControlLeft", 17, CONTROL),
    ("Ctrl", "Control", "ControlLeft", 17, CONTROL),
    ("Shift", "Shift", "ShiftLeft", 16, SHIFT),
    ("Alt", "Alt", "AltLeft", 18, ALT),
    ("Meta", "Meta", "MetaLeft", 91, META),
    ("Command", "Meta", "MetaLeft", 91, META),
    ("Cmd", "Meta", "MetaLeft", 91, META),
    // Playwright's portable name: Control on Linux, where Chromium runs here.
    ("ControlOrMeta", "Control", "ControlLeft", 17, CONTROL),
];

/// Punctuation on a US keyboard: (character, code, key code).
const PUNCTUATION: [(char, &str, u32); 22] = [
    (' ', "Space", 32),
    ('-', "Minus", 189),
    ('_', "Minus", 189),
    ('=', "Equal", 187),
    ('+', "Equal", 187),
    ('[', "BracketLeft", 219),
    ('{', "BracketLeft", 219),
    (']', "BracketRight", 221),
    ('}', "BracketRight", 221),
    ('\\', "Backslash", 220),
    ('|', "Backslash", 220),
    (';', "Semicolon", 186),
    (':', "Semicolon", 186),
    ('\'', "Quote", 222),
    ('"', "Quote", 222),
    (',', "Comma", 188),
    ('<', "Comma", 188),
    ('.', "Period", 190),
    ('>', "Period", 190),
    ('/', "Slash", 191),
    ('?', "Slash", 191),
    ('`', "Backquote", 192),
];

/// The key that types `c`: letters and digits get their physical key, other characters
/// (any script) are typed as text with no key code, as Playwright does.
pub fn key_for_char(c: char) -> Key {
    match c {
        '\n' | '\r' => return named("Enter").expect("Enter is a named key"),
        '\t' => return named("Tab").expect("Tab is a named key"),
        _ => {}
    }
    let (code, key_code) = if c.is_ascii_alphabetic() {
        let upper = c.to_ascii_uppercase();
        (format!("Key{upper}"), upper as u32)
    } else if c.is_ascii_digit() {
        (format!("Digit{c}"), c as u32)
    } else if let Some((_, code, key_code)) = PUNCTUATION.iter().find(|(p, _, _)| *p == c) {
        (code.to_string(), *key_code)
    } else {
        (String::new(), 0)
    };
    Key {
        key: c.to_string(),
        code,
        key_code,
        text: Some(c.to_string()),
    }
}

fn named(name: &str) -> Option<Key> {
    let (key, code, key_code, text) = NAMED.iter().find(|(n, ..)| *n == name)?;
    Some(Key {
        key: if *key == "Space" {
            " ".into()
        } else {
            key.to_string()
        },
        code: code.to_string(),
        key_code: *key_code,
        text: text.map(str::to_string),
    })
}

fn function_key(name: &str) -> Option<Key> {
    let n: u32 = name.strip_prefix('F')?.parse().ok()?;
    (1..=24).contains(&n).then(|| Key {
        key: name.to_string(),
        code: name.to_string(),
        key_code: 111 + n,
        text: None,
    })
}

/// Parses `Enter`, `a`, `Control+A`, `Shift+Tab`, `Control++` (the `+` key). Errors say
/// what is wrong, for a 400.
pub fn parse_chord(spec: &str) -> Result<Chord, String> {
    if spec.is_empty() {
        return Err("key must not be empty (for example \"Enter\" or \"Control+A\")".into());
    }
    // The last part is the key; `+` alone (or a trailing `++`) is the plus key itself.
    let (modifier_part, key_part) = if spec == "+" {
        ("", "+")
    } else if let Some(prefix) = spec.strip_suffix("++") {
        (prefix, "+")
    } else {
        match spec.rsplit_once('+') {
            Some((prefix, key)) => (prefix, key),
            None => ("", spec),
        }
    };
    let mut modifiers = Vec::new();
    let mut modifier_bits = 0;
    if !modifier_part.is_empty() {
        for name in modifier_part.split('+') {
            let Some((_, key, code, key_code, bit)) = MODIFIERS.iter().find(|m| m.0 == name) else {
                return Err(format!(
                    "unknown modifier {name:?} in {spec:?} (use Control, Shift, Alt or Meta)"
                ));
            };
            modifier_bits |= bit;
            modifiers.push(Key {
                key: key.to_string(),
                code: code.to_string(),
                key_code: *key_code,
                text: None,
            });
        }
    }
    let mut key = if let Some((_, key, code, key_code, _)) =
        MODIFIERS.iter().find(|m| m.0 == key_part)
    {
        Key {
            key: key.to_string(),
            code: code.to_string(),
            key_code: *key_code,
            text: None,
        }
    } else if let Some(key) = named(key_part).or_else(|| function_key(key_part)) {
        key
    } else {
        let mut chars = key_part.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => key_for_char(c),
            _ => {
                return Err(format!(
                    "unknown key {key_part:?} in {spec:?} (use a single character or a name such as Enter, Tab, Escape, ArrowDown, F5)"
                ))
            }
        }
    };
    // Shift types the upper-case letter; Control, Alt or Meta type nothing, so the page
    // sees a shortcut, not text.
    if modifier_bits & (CONTROL | ALT | META) != 0 {
        key.text = None;
    } else if modifier_bits & SHIFT != 0 {
        if let Some(text) = &key.text {
            if text.len() == 1 && text.chars().all(|c| c.is_ascii_lowercase()) {
                let upper = text.to_ascii_uppercase();
                key.key = upper.clone();
                key.text = Some(upper);
            }
        }
    }
    Ok(Chord {
        modifiers,
        modifier_bits,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_keys_carry_their_codes() {
        let enter = parse_chord("Enter").unwrap();
        assert_eq!(enter.key.key_code, 13);
        assert_eq!(enter.key.text.as_deref(), Some("\r"));
        assert!(enter.modifiers.is_empty());
        assert_eq!(parse_chord("F5").unwrap().key.key_code, 116);
        assert_eq!(parse_chord("Space").unwrap().key.key, " ");
    }

    #[test]
    fn chords_collect_modifiers_and_drop_text() {
        let select_all = parse_chord("Control+A").unwrap();
        assert_eq!(select_all.modifier_bits, CONTROL);
        assert_eq!(select_all.key.code, "KeyA");
        assert_eq!(select_all.key.key_code, 65);
        assert_eq!(select_all.key.text, None);
        let redo = parse_chord("Control+Shift+z").unwrap();
        assert_eq!(redo.modifier_bits, CONTROL | SHIFT);
        assert_eq!(redo.modifiers.len(), 2);
        let shifted = parse_chord("Shift+a").unwrap();
        assert_eq!(shifted.key.text.as_deref(), Some("A"));
    }

    #[test]
    fn plus_is_a_key_too() {
        assert_eq!(parse_chord("+").unwrap().key.key, "+");
        let zoom = parse_chord("Control++").unwrap();
        assert_eq!(zoom.modifier_bits, CONTROL);
        assert_eq!(zoom.key.key, "+");
    }

    #[test]
    fn unknown_names_are_refused_with_a_hint() {
        assert!(parse_chord("").is_err());
        assert!(parse_chord("Hyper+A").unwrap_err().contains("modifier"));
        assert!(parse_chord("Enterr").unwrap_err().contains("Enter, Tab"));
        assert!(parse_chord("F25").is_err());
    }

    #[test]
    fn characters_map_to_physical_keys_where_one_exists() {
        assert_eq!(key_for_char('7').code, "Digit7");
        assert_eq!(key_for_char('/').key_code, 191);
        let accented = key_for_char('é');
        assert_eq!(accented.key_code, 0);
        assert_eq!(accented.text.as_deref(), Some("é"));
        assert_eq!(key_for_char('\n').key, "Enter");
    }
}
