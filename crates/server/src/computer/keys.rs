//! Key names for `keyboard/press`: the names E2B's desktop SDK accepts (`ctrl`, `enter`,
//! `page_down`, ...), X keysym names (`Return`, `Control_L`, ...), and single printable
//! characters, mapped to the keysym `xdotool key` is given. Anything else is refused before
//! a command runs: xdotool itself warns about an unknown name on stderr and exits 0, so the
//! caller would never learn its key was dropped.

/// E2B's aliases (lower case) and the keysym each stands for.
const ALIASES: &[(&str, &str)] = &[
    ("alt", "Alt_L"),
    ("alt_left", "Alt_L"),
    ("alt_right", "Alt_R"),
    ("backspace", "BackSpace"),
    ("break", "Pause"),
    ("caps_lock", "Caps_Lock"),
    ("cmd", "Super_L"),
    ("command", "Super_L"),
    ("control", "Control_L"),
    ("control_left", "Control_L"),
    ("control_right", "Control_R"),
    ("ctrl", "Control_L"),
    ("del", "Delete"),
    ("delete", "Delete"),
    ("down", "Down"),
    ("end", "End"),
    ("enter", "Return"),
    ("esc", "Escape"),
    ("escape", "Escape"),
    ("home", "Home"),
    ("insert", "Insert"),
    ("left", "Left"),
    ("menu", "Menu"),
    ("meta", "Meta_L"),
    ("num_lock", "Num_Lock"),
    ("page_down", "Page_Down"),
    ("page_up", "Page_Up"),
    ("pause", "Pause"),
    ("print", "Print"),
    ("return", "Return"),
    ("right", "Right"),
    ("scroll_lock", "Scroll_Lock"),
    ("shift", "Shift_L"),
    ("shift_left", "Shift_L"),
    ("shift_right", "Shift_R"),
    ("space", "space"),
    ("super", "Super_L"),
    ("super_left", "Super_L"),
    ("super_right", "Super_R"),
    ("tab", "Tab"),
    ("up", "Up"),
    ("win", "Super_L"),
    ("windows", "Super_L"),
];

/// X keysym names taken as they are (case matters for these, as in X).
const KEYSYMS: &[&str] = &[
    "Alt_L",
    "Alt_R",
    "BackSpace",
    "Caps_Lock",
    "Control_L",
    "Control_R",
    "Delete",
    "Down",
    "End",
    "Escape",
    "Home",
    "Insert",
    "Left",
    "Menu",
    "Meta_L",
    "Meta_R",
    "Num_Lock",
    "Page_Down",
    "Page_Up",
    "Pause",
    "Print",
    "Return",
    "Right",
    "Scroll_Lock",
    "Shift_L",
    "Shift_R",
    "Super_L",
    "Super_R",
    "Tab",
    "Up",
    "space",
    "KP_Enter",
    "KP_Add",
    "KP_Subtract",
    "KP_Multiply",
    "KP_Divide",
    "KP_Decimal",
    "KP_0",
    "KP_1",
    "KP_2",
    "KP_3",
    "KP_4",
    "KP_5",
    "KP_6",
    "KP_7",
    "KP_8",
    "KP_9",
    "minus",
    "plus",
    "equal",
    "comma",
    "period",
    "slash",
    "backslash",
    "semicolon",
    "apostrophe",
    "grave",
    "bracketleft",
    "bracketright",
    "XF86AudioMute",
    "XF86AudioLowerVolume",
    "XF86AudioRaiseVolume",
    "XF86Back",
    "XF86Forward",
    "XF86Reload",
];

/// Punctuation by its keysym name: xdotool refuses some characters in a key sequence
/// (`.`, `-`, brackets, `|`) and takes `+` as the separator between keys.
const PUNCTUATION: &[(char, &str)] = &[
    ('+', "plus"),
    ('-', "minus"),
    ('.', "period"),
    (',', "comma"),
    ('/', "slash"),
    ('\\', "backslash"),
    (';', "semicolon"),
    (':', "colon"),
    ('\'', "apostrophe"),
    ('"', "quotedbl"),
    ('`', "grave"),
    ('~', "asciitilde"),
    ('[', "bracketleft"),
    (']', "bracketright"),
    ('{', "braceleft"),
    ('}', "braceright"),
    ('(', "parenleft"),
    (')', "parenright"),
    ('<', "less"),
    ('>', "greater"),
    ('=', "equal"),
    ('|', "bar"),
    ('!', "exclam"),
    ('?', "question"),
    ('@', "at"),
    ('#', "numbersign"),
    ('$', "dollar"),
    ('%', "percent"),
    ('^', "asciicircum"),
    ('&', "ampersand"),
    ('*', "asterisk"),
    ('_', "underscore"),
];

/// The most keys pressed together.
pub const MAX_KEYS: usize = 8;

/// The keysym for `name`, or `None` when it is not a key this API knows.
pub fn keysym(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if let Some((_, sym)) = ALIASES.iter().find(|(alias, _)| *alias == lower) {
        return Some((*sym).to_string());
    }
    if let Some(sym) = KEYSYMS.iter().find(|k| **k == name) {
        return Some((*sym).to_string());
    }
    // F1 to F24, in either case.
    if let Some(n) = lower.strip_prefix('f')
        && let Ok(n) = n.parse::<u8>()
        && (1..=24).contains(&n)
        && !n.to_string().starts_with('0')
        && lower.len() == n.to_string().len() + 1
    {
        return Some(format!("F{n}"));
    }
    // One printable ASCII character: letters and digits are their own keysym, punctuation
    // goes by its keysym's name.
    let mut chars = name.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii_alphanumeric() => Some(lower),
        (Some(c), None) => PUNCTUATION
            .iter()
            .find(|(p, _)| *p == c)
            .map(|(_, sym)| (*sym).to_string()),
        _ => None,
    }
}

/// `keys` pressed together as one `xdotool key` argument (`Control_L+s`), or the first
/// name that is not a key.
pub fn combination(keys: &[String]) -> Result<String, String> {
    let mut syms = Vec::with_capacity(keys.len());
    for key in keys {
        syms.push(keysym(key).ok_or_else(|| key.clone())?);
    }
    Ok(syms.join("+"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_aliases_map_to_keysyms_in_any_case() {
        assert_eq!(keysym("ctrl").as_deref(), Some("Control_L"));
        assert_eq!(keysym("Enter").as_deref(), Some("Return"));
        assert_eq!(keysym("PAGE_DOWN").as_deref(), Some("Page_Down"));
    }

    #[test]
    fn keysyms_function_keys_and_characters_pass() {
        assert_eq!(keysym("Return").as_deref(), Some("Return"));
        assert_eq!(keysym("F12").as_deref(), Some("F12"));
        assert_eq!(keysym("f1").as_deref(), Some("F1"));
        assert_eq!(keysym("S").as_deref(), Some("s"));
        assert_eq!(keysym("7").as_deref(), Some("7"));
        assert_eq!(keysym("+").as_deref(), Some("plus"));
        assert_eq!(keysym(".").as_deref(), Some("period"));
        assert_eq!(keysym("|").as_deref(), Some("bar"));
    }

    #[test]
    fn unknown_names_are_refused() {
        for bad in [
            "",
            "F0",
            "F25",
            "F01",
            "ctrlx",
            "return;rm",
            "é",
            " ",
            "--help",
            "Return ",
        ] {
            assert_eq!(keysym(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_combination_names_the_first_bad_key() {
        let ok = ["ctrl".to_string(), "shift".to_string(), "t".to_string()];
        assert_eq!(combination(&ok).as_deref(), Ok("Control_L+Shift_L+t"));
        let bad = ["ctrl".to_string(), "hyperdrive".to_string()];
        assert_eq!(combination(&bad), Err("hyperdrive".to_string()));
    }
}
