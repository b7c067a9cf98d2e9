//! A counter drawn as a badge: the SVG image READMEs and pages embed, in the
//! three styles shields.io draws (`flat`, `flat-square`, `for-the-badge`),
//! and the parts of it that shields.io's endpoint badge reads as JSON
//! (label, message, colour). Pure: no I/O, no HTTP.
//!
//! Nothing a request says reaches the image unchecked. A label is at most
//! [`MAX_LABEL_CHARS`] characters without control or bidirectional
//! formatting characters, and is XML-escaped wherever it is written; a
//! colour is one of [`NAMED_COLORS`] or a hex colour, written as the hex
//! digits it parsed to, never as sent; a style is one of three names.
//!
//! An SVG carries no font metrics, so the badge's size comes from an
//! estimate of its text's width: Verdana's advance widths (what shields.io
//! measures with), at 11 px. The text is drawn with `textLength` set to
//! that estimate, so a browser that falls back to another font still fits
//! the text to the box the badge drew for it.

use std::borrow::Cow;
use std::fmt::Write;

/// The longest label, in characters: a badge is a word or two, and a bound
/// keeps every badge small whatever a URL asks.
pub const MAX_LABEL_CHARS: usize = 64;

/// How a badge is drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Style {
    /// 20 px high, rounded corners, a light gradient: shields.io's default.
    #[default]
    Flat,
    /// 20 px high, square corners, no gradient.
    FlatSquare,
    /// 28 px high, square, upper-case text spaced out, the message in bold.
    ForTheBadge,
}

impl Style {
    /// The names `style` takes.
    pub const NAMES: [&'static str; 3] = ["flat", "flat-square", "for-the-badge"];

    /// A style by its name; the error says which names there are.
    pub fn parse(raw: &str) -> Result<Style, String> {
        match raw {
            "flat" => Ok(Style::Flat),
            "flat-square" => Ok(Style::FlatSquare),
            "for-the-badge" => Ok(Style::ForTheBadge),
            _ => Err(format!(
                "style {:?} is not a badge style; use one of {}",
                shown(raw),
                Self::NAMES.join(", ")
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Style::Flat => "flat",
            Style::FlatSquare => "flat-square",
            Style::ForTheBadge => "for-the-badge",
        }
    }
}

/// shields.io's named colours and the hex colours it draws them with.
pub const NAMED_COLORS: [(&str, &str); 16] = [
    ("brightgreen", "#4c1"),
    ("green", "#97ca00"),
    ("yellowgreen", "#a4a61d"),
    ("yellow", "#dfb317"),
    ("orange", "#fe7d37"),
    ("red", "#e05d44"),
    ("blue", "#007ec6"),
    ("lightgrey", "#9f9f9f"),
    ("lightgray", "#9f9f9f"),
    ("grey", "#555"),
    ("gray", "#555"),
    ("success", "#4c1"),
    ("important", "#fe7d37"),
    ("critical", "#e05d44"),
    ("informational", "#007ec6"),
    ("inactive", "#9f9f9f"),
];

/// The colour of a badge's label part.
const LABEL_COLOR: &str = "#555";

/// A badge's colour: a named one, or hex digits (3 or 6, with or without
/// `#`), kept as lower-case `#` and digits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Color {
    name: Option<&'static str>,
    hex: String,
}

impl Default for Color {
    /// `blue`, the colour of a count.
    fn default() -> Color {
        Color::parse("blue").expect("a named colour")
    }
}

impl Color {
    /// A named colour (case-insensitive) or a hex colour; the error says
    /// what a colour may be.
    pub fn parse(raw: &str) -> Result<Color, String> {
        let lower = raw.to_ascii_lowercase();
        if let Some((name, hex)) = NAMED_COLORS.iter().find(|(n, _)| *n == lower) {
            return Ok(Color {
                name: Some(name),
                hex: (*hex).to_string(),
            });
        }
        let digits = lower.strip_prefix('#').unwrap_or(&lower);
        if matches!(digits.len(), 3 | 6) && digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Color {
                name: None,
                hex: format!("#{digits}"),
            });
        }
        Err(format!(
            "color {:?} is not a colour; use a name ({}) or 3 or 6 hex digits (4c1, %23007ec6)",
            shown(raw),
            NAMED_COLORS.map(|(n, _)| n).join(", ")
        ))
    }

    /// `#` and lower-case hex digits, as drawn.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// As shields.io's endpoint badge reads it: the name, else the hex
    /// colour (it takes both).
    pub fn shields(&self) -> &str {
        self.name.unwrap_or(&self.hex)
    }

    /// The red, green and blue of the colour, 0 to 255.
    fn rgb(&self) -> [u8; 3] {
        let d = &self.hex.as_bytes()[1..];
        let nibble = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
        match d.len() {
            3 => [0, 1, 2].map(|i| nibble(d[i]) * 17),
            _ => [0, 2, 4].map(|i| nibble(d[i]) * 16 + nibble(d[i + 1])),
        }
    }

    /// Whether white text would be hard to read on it (as shields.io
    /// tells: perceived brightness over 0.69), so its text is drawn dark.
    fn is_light(&self) -> bool {
        let [r, g, b] = self.rgb().map(f64::from);
        (r * 299.0 + g * 587.0 + b * 114.0) / 255_000.0 > 0.69
    }
}

/// Checks a label: at most [`MAX_LABEL_CHARS`] characters, none a control
/// character nor a bidirectional formatting one (which would make a badge
/// read other than its text says). An empty label draws the message alone.
pub fn validate_label(raw: &str) -> Result<(), String> {
    let n = raw.chars().count();
    if n > MAX_LABEL_CHARS {
        return Err(format!(
            "label is {n} characters, over the limit of {MAX_LABEL_CHARS}"
        ));
    }
    if let Some(c) = raw.chars().find(|c| c.is_control() || is_bidi_control(*c)) {
        return Err(format!(
            "label contains the character U+{:04X}; control and bidirectional formatting characters are not drawn",
            c as u32
        ));
    }
    Ok(())
}

/// The bidirectional embedding, override and isolate characters, and the
/// marks: text that draws in another order than it reads.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A label that was given, cut to [`MAX_LABEL_CHARS`] characters with `…`
/// when longer (a counter's action, up to 512 bytes, when no label is).
pub fn fit_label(raw: &str) -> Cow<'_, str> {
    match raw.char_indices().nth(MAX_LABEL_CHARS - 1) {
        Some((at, _)) if raw[at..].chars().nth(1).is_some() => {
            Cow::Owned(format!("{}…", &raw[..at]))
        }
        _ => Cow::Borrowed(raw),
    }
}

/// A count as a badge shows it: `999`, `1.2k`, `34k`, `567k`, `3.4M`, up
/// to `9.2E` (i64's largest). Rounded towards zero, so a badge never shows
/// more than was counted (1,999 is `1.9k`); one decimal below 10 of a unit,
/// none from 10 on, none when it is 0 (`1k`, not `1.0k`).
pub fn abbreviate(n: i64) -> String {
    const UNITS: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    let sign = if n < 0 { "-" } else { "" };
    let abs = n.unsigned_abs();
    if abs < 1_000 {
        return n.to_string();
    }
    let mut scale = 1_000u64;
    let mut unit = 0;
    while unit + 1 < UNITS.len() && abs / scale >= 1_000 {
        scale *= 1_000;
        unit += 1;
    }
    let whole = abs / scale;
    let tenths = abs % scale / (scale / 10);
    if whole < 10 && tenths > 0 {
        format!("{sign}{whole}.{tenths}{}", UNITS[unit])
    } else {
        format!("{sign}{whole}{}", UNITS[unit])
    }
}

/// The message of a count: abbreviated, or every digit.
pub fn message(value: i64, abbreviated: bool) -> String {
    if abbreviated {
        abbreviate(value)
    } else {
        value.to_string()
    }
}

/// Verdana's advance widths of the printable ASCII characters (`' '` to
/// `'~'`), in its units of 1/2048 em.
#[rustfmt::skip]
const VERDANA_ADVANCE: [u16; 95] = [
    // ' ' ! " # $ % & ' ( ) * + , - . /
    720, 806, 940, 1676, 1302, 2204, 1488, 550, 930, 930, 1302, 1676, 745, 930, 745, 930,
    // 0-9
    1302, 1302, 1302, 1302, 1302, 1302, 1302, 1302, 1302, 1302,
    // : ; < = > ? @
    930, 930, 1676, 1676, 1676, 1117, 2048,
    // A-Z
    1400, 1404, 1430, 1578, 1295, 1177, 1588, 1539, 862, 931, 1419, 1140, 1726,
    1532, 1612, 1235, 1612, 1424, 1400, 1262, 1499, 1400, 2025, 1403, 1260, 1403,
    // [ \ ] ^ _ `
    930, 930, 930, 1676, 1302, 1302,
    // a-z
    1230, 1276, 1067, 1276, 1220, 720, 1276, 1296, 562, 705, 1212, 562, 1992,
    1296, 1243, 1276, 1276, 874, 1067, 807, 1296, 1212, 1676, 1212, 1212, 1076,
    // { | } ~
    1300, 930, 1300, 1676,
];

/// What a character outside the table is taken to take: a full em for the
/// wide scripts and emoji, else a little over an average letter (too wide
/// leaves a pixel of room, too narrow would squeeze the text).
fn advance(c: char) -> u16 {
    let u = c as u32;
    match u {
        0x20..=0x7e => VERDANA_ADVANCE[(u - 0x20) as usize],
        0x1100..=0x115f
        | 0x2e80..=0xa4cf
        | 0xac00..=0xd7a3
        | 0xf900..=0xfaff
        | 0xfe30..=0xfe4f
        | 0xff00..=0xff60
        | 0xffe0..=0xffe6
        | 0x1f300..=0x1faff
        | 0x20000..=0x3fffd => 2048,
        _ => 1400,
    }
}

/// The width of `text` in Verdana at `px` pixels, estimated from the
/// advance widths (no kerning, as a badge's short text barely has any).
pub fn text_width(text: &str, px: f64) -> f64 {
    let units: u64 = text.chars().map(|c| u64::from(advance(c))).sum();
    units as f64 * px / 2048.0
}

/// Escapes the five XML special characters, for text and attribute values.
pub fn escape_xml(s: &str) -> Cow<'_, str> {
    if !s.contains(['&', '<', '>', '"', '\'']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A badge to draw: a label (maybe empty) on grey, a message on `color`.
#[derive(Clone, Debug)]
pub struct Badge<'a> {
    pub label: &'a str,
    pub message: &'a str,
    pub color: &'a Color,
    pub style: Style,
}

/// One part of a badge as laid out: its text, where it starts and how wide
/// its box and its text are.
struct Part {
    text: String,
    x: u32,
    width: u32,
    text_width: u32,
    fill: String,
    dark_text: bool,
    bold: bool,
}

impl Badge<'_> {
    /// The badge as a standalone SVG document (UTF-8, no XML declaration,
    /// as shields.io serves them), with a `<title>` and `aria-label` for
    /// screen readers.
    pub fn svg(&self) -> String {
        let tall = self.style == Style::ForTheBadge;
        let (height, px, pad, spacing) = if tall {
            (28, 10.0, 9.0, 1.25)
        } else {
            (20, 11.0, 5.0, 0.0)
        };
        let mut parts = Vec::with_capacity(2);
        let mut x = 0;
        let mut layout = |text: &str, color: &str, bold: bool| {
            let text = if tall {
                text.to_uppercase()
            } else {
                text.to_string()
            };
            // Verdana Bold is about an eighth wider than the regular face.
            let bold_factor = if bold { 1.12 } else { 1.0 };
            let chars = text.chars().count() as f64;
            let tw = (text_width(&text, px) * bold_factor + spacing * chars).ceil() as u32;
            let width = tw + (2.0 * pad) as u32;
            let fill = Color::parse(color).expect("a drawn colour parses");
            parts.push(Part {
                text,
                x,
                width,
                text_width: tw,
                dark_text: fill.is_light(),
                fill: fill.hex,
                bold,
            });
            x += width;
        };
        if !self.label.is_empty() {
            layout(self.label, LABEL_COLOR, false);
        }
        layout(self.message, self.color.hex(), tall);
        let total = x;

        let title = if self.label.is_empty() {
            escape_xml(self.message).into_owned()
        } else {
            format!("{}: {}", escape_xml(self.label), escape_xml(self.message))
        };
        let mut s = String::with_capacity(1024);
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height}" viewBox="0 0 {total} {height}" role="img" aria-label="{title}"><title>{title}</title>"#
        );
        let rounded = self.style == Style::Flat;
        if rounded {
            let _ = write!(
                s,
                r##"<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" stop-opacity=".1"/><stop offset="1" stop-opacity=".1"/></linearGradient><clipPath id="r"><rect width="{total}" height="{height}" rx="3" fill="#fff"/></clipPath><g clip-path="url(#r)">"##
            );
        } else {
            s.push_str(r#"<g shape-rendering="crispEdges">"#);
        }
        for p in &parts {
            let _ = write!(
                s,
                r#"<rect x="{}" width="{}" height="{height}" fill="{}"/>"#,
                p.x, p.width, p.fill
            );
        }
        if rounded {
            let _ = write!(
                s,
                r#"<rect width="{total}" height="{height}" fill="url(#s)"/>"#
            );
        }
        s.push_str("</g>");
        let _ = write!(
            s,
            r#"<g text-anchor="middle" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" text-rendering="geometricPrecision" font-size="{px}">"#
        );
        for p in &parts {
            let text = escape_xml(&p.text);
            let cx = f64::from(p.x) + f64::from(p.width) / 2.0;
            let weight = if p.bold { r#" font-weight="bold""# } else { "" };
            let (fill, shadow) = if p.dark_text {
                ("#333", "#ccc")
            } else {
                ("#fff", "#010101")
            };
            let spacing_attr = if tall {
                r#" letter-spacing="1.25""#
            } else {
                ""
            };
            if tall {
                let _ = write!(
                    s,
                    r#"<text x="{cx}" y="18"{weight}{spacing_attr} fill="{fill}" textLength="{}">{text}</text>"#,
                    p.text_width
                );
            } else {
                // The shadow a pixel below, then the text.
                let _ = write!(
                    s,
                    r#"<text aria-hidden="true" x="{cx}" y="15" fill="{shadow}" fill-opacity=".3" textLength="{tw}">{text}</text><text x="{cx}" y="14" fill="{fill}" textLength="{tw}">{text}</text>"#,
                    tw = p.text_width
                );
            }
        }
        s.push_str("</g></svg>");
        s
    }
}

/// At most 40 characters of a bad value, for an error message.
fn shown(raw: &str) -> Cow<'_, str> {
    match raw.char_indices().nth(40) {
        Some((at, _)) => Cow::Owned(format!("{}…", &raw[..at])),
        None => Cow::Borrowed(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_abbreviate_towards_zero_with_one_decimal_below_ten() {
        for (n, shown) in [
            (0, "0"),
            (7, "7"),
            (999, "999"),
            (1_000, "1k"),
            (1_049, "1k"),
            (1_200, "1.2k"),
            (1_999, "1.9k"),
            (9_999, "9.9k"),
            (10_000, "10k"),
            (34_567, "34k"),
            (999_999, "999k"),
            (1_000_000, "1M"),
            (3_400_000, "3.4M"),
            (3_499_999, "3.4M"),
            (12_345_678_901, "12G"),
            (-1_250, "-1.2k"),
            (-999, "-999"),
            (i64::MAX, "9.2E"),
            (i64::MIN, "-9.2E"),
        ] {
            assert_eq!(abbreviate(n), shown, "{n}");
        }
        assert_eq!(message(1_234_567, false), "1234567");
        assert_eq!(message(1_234_567, true), "1.2M");
    }

    #[test]
    fn colours_are_names_or_hex_and_nothing_else() {
        assert_eq!(Color::parse("brightgreen").unwrap().hex(), "#4c1");
        assert_eq!(Color::parse("Blue").unwrap().shields(), "blue");
        assert_eq!(Color::parse("4C1").unwrap().hex(), "#4c1");
        assert_eq!(Color::parse("#007ec6").unwrap().hex(), "#007ec6");
        assert_eq!(Color::parse("ff0000").unwrap().shields(), "#ff0000");
        for bad in [
            "",
            "#",
            "12",
            "1234",
            "#ggg",
            "red;stroke:url(x)",
            "\"/><script>",
            "rgb(1,2,3)",
            "purple",
        ] {
            let e = Color::parse(bad).unwrap_err();
            assert!(e.starts_with("color "), "{bad}: {e}");
        }
        assert_eq!(Color::default().hex(), "#007ec6");
    }

    #[test]
    fn styles_are_the_three_names() {
        for name in Style::NAMES {
            assert_eq!(Style::parse(name).unwrap().as_str(), name);
        }
        let e = Style::parse("plastic").unwrap_err();
        assert!(
            e.contains("\"plastic\"") && e.contains("for-the-badge"),
            "{e}"
        );
    }

    #[test]
    fn labels_are_bounded_and_drawable() {
        assert!(validate_label("").is_ok());
        assert!(validate_label("views <3 & \"more\"").is_ok());
        assert!(validate_label(&"é".repeat(MAX_LABEL_CHARS)).is_ok());
        let e = validate_label(&"a".repeat(MAX_LABEL_CHARS + 1)).unwrap_err();
        assert!(e.contains("65 characters"), "{e}");
        assert!(validate_label("a\nb").unwrap_err().contains("U+000A"));
        assert!(validate_label("abc\u{202e}fed")
            .unwrap_err()
            .contains("U+202E"));
        assert_eq!(fit_label("VIEW"), "VIEW");
        let exact = "x".repeat(MAX_LABEL_CHARS);
        assert_eq!(fit_label(&exact), exact);
        let long = "y".repeat(MAX_LABEL_CHARS + 10);
        let fit = fit_label(&long);
        assert_eq!(fit.chars().count(), MAX_LABEL_CHARS);
        assert!(fit.ends_with('…'));
    }

    #[test]
    fn widths_follow_verdanas_advances() {
        // Verdana's digits are 1302/2048 em: 7 px at 11 px, near enough.
        assert!((text_width("0", 11.0) - 6.993).abs() < 0.001);
        assert!((text_width("1234567890", 11.0) - 69.93).abs() < 0.01);
        // Wide letters take more than narrow ones.
        assert!(text_width("mmmm", 11.0) > 2.0 * text_width("iiii", 11.0));
        // A CJK character takes a full em.
        assert_eq!(text_width("訪", 11.0), 11.0);
        assert_eq!(text_width("", 11.0), 0.0);
        assert!((text_width("a", 10.0) / text_width("a", 11.0) - 10.0 / 11.0).abs() < 1e-9);
    }

    #[test]
    fn xml_specials_are_escaped() {
        assert_eq!(escape_xml("plain"), "plain");
        assert_eq!(
            escape_xml(r#"<a href="x">&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&apos;&lt;/a&gt;"
        );
    }

    fn badge<'a>(label: &'a str, message: &'a str, color: &'a Color, style: Style) -> String {
        Badge {
            label,
            message,
            color,
            style,
        }
        .svg()
    }

    /// The value of the first `name="..."` attribute after `from`.
    fn attr<'s>(svg: &'s str, from: &str, name: &str) -> &'s str {
        let at = svg
            .find(from)
            .unwrap_or_else(|| panic!("no {from} in {svg}"));
        let rest = &svg[at..];
        let start = rest.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        let len = rest[start..].find('"').unwrap();
        &rest[start..start + len]
    }

    #[test]
    fn a_flat_badge_is_sized_by_its_text() {
        let blue = Color::default();
        let svg = badge("views", "1.2k", &blue, Style::Flat);
        let label_w = (text_width("views", 11.0)).ceil() as u32 + 10;
        let msg_w = (text_width("1.2k", 11.0)).ceil() as u32 + 10;
        assert_eq!(
            attr(&svg, "<svg", "width"),
            (label_w + msg_w).to_string(),
            "{svg}"
        );
        assert_eq!(attr(&svg, "<svg", "height"), "20");
        assert!(svg.contains(r#"<title>views: 1.2k</title>"#), "{svg}");
        assert!(svg.contains(&format!(
            r##"<rect x="{label_w}" width="{msg_w}" height="20" fill="#007ec6"/>"##
        )));
        assert!(svg.contains(r#"rx="3""#));
        // A longer count makes a wider badge.
        let wider = badge("views", "1234567", &blue, Style::Flat);
        let w = |s: &str| attr(s, "<svg", "width").parse::<u32>().unwrap();
        assert!(w(&wider) > w(&svg));
    }

    #[test]
    fn square_and_tall_styles() {
        let green = Color::parse("green").unwrap();
        let sq = badge("views", "12", &green, Style::FlatSquare);
        assert!(
            !sq.contains("rx=") && !sq.contains("linearGradient"),
            "{sq}"
        );
        assert!(sq.contains("crispEdges"));
        let tall = badge("views", "12", &green, Style::ForTheBadge);
        assert_eq!(attr(&tall, "<svg", "height"), "28");
        assert!(tall.contains(">VIEWS</text>"), "{tall}");
        assert!(tall.contains(r#"font-weight="bold""#));
    }

    #[test]
    fn an_empty_label_draws_the_message_alone() {
        let red = Color::parse("red").unwrap();
        let svg = badge("", "5", &red, Style::Flat);
        assert_eq!(svg.matches("<rect x=").count(), 1, "{svg}");
        assert!(svg.contains("<title>5</title>"));
    }

    #[test]
    fn light_colours_get_dark_text() {
        let light = Color::parse("fff").unwrap();
        let svg = badge("a", "1", &light, Style::Flat);
        assert!(svg.contains(r##"fill="#333""##), "{svg}");
        let dark = badge("a", "1", &Color::default(), Style::Flat);
        assert!(!dark.contains(r##"fill="#333""##), "{dark}");
    }

    #[test]
    fn text_is_escaped_in_title_label_and_aria() {
        let c = Color::default();
        let svg = badge(r#""><script>alert(1)</script>"#, "1", &c, Style::Flat);
        assert!(!svg.contains("<script"), "{svg}");
        assert!(svg.contains("&lt;script&gt;"));
        assert!(svg.contains("aria-label=\"&quot;&gt;&lt;script"), "{svg}");
    }
}
