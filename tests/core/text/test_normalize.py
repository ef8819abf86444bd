from __future__ import annotations

import pytest

from proxy.core.text.normalize import (
    default_segmenter,
    fold_space,
    mask_volatile,
    normalize_text,
    system_prompt_version,
    tagged_words,
)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("谢谢", "谢谢！", id="zh-exclamation"),
        pytest.param("谢谢", "谢谢!!!", id="repeated-exclamation"),
        pytest.param("谢谢。", "谢谢", id="zh-full-stop"),
        pytest.param("你好，请问杭州怎么走？", "你好,请问杭州怎么走?", id="full-vs-half-punctuation"),
        pytest.param("ｈｅｌｌｏ　ｗｏｒｌｄ！", "hello world", id="full-width-latin"),
        pytest.param("Hello   World", "hello world", id="case-and-spaces"),
        pytest.param("我用 Python 写", "我用python写", id="space-at-cjk-boundary"),
        pytest.param("「推荐」一下", '"推荐"一下', id="corner-quotes"),
        pytest.param("好的?!", "好的", id="mixed-terminal"),
        pytest.param("预算八千以内", "预算8000以内", id="zh-thousands"),
        pytest.param("预算8k以内", "预算8000以内", id="k-suffix"),
        pytest.param("预算8K以内", "预算8000以内", id="k-suffix-upper"),
        pytest.param("预算8,000元", "预算8000元", id="thousands-separator"),
        pytest.param("预算1.5万", "预算15000", id="digit-wan"),
        pytest.param("预算一万五", "预算15000", id="zh-wan-five"),
        pytest.param("玩三天", "玩3天", id="zh-days"),
    ],
)
def test_variants_normalise_to_the_same_string(a: str, b: str) -> None:
    assert normalize_text(a) == normalize_text(b)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("八千", "8000", id="ba-qian"),
        pytest.param("一万", "10000", id="yi-wan"),
        pytest.param("两万五", "25000", id="liang-wan-wu"),
        pytest.param("8k", "8000", id="8k"),
        pytest.param("8K", "8000", id="8K"),
        pytest.param("1.5万", "15000", id="1.5wan"),
        pytest.param("三天", "3天", id="san-tian"),
        pytest.param("推荐三款手机", "推荐3款手机", id="count-measure"),
        pytest.param("三个人住两晚", "3个人住2晚", id="lone-digit-before-measure"),
        pytest.param("第三天去西湖", "第3天去西湖", id="ordinal"),
        pytest.param("二零二五年六月二十日", "2025年6月20日", id="spelled-date"),
        pytest.param("重量一点二公斤以下", "重量1.2公斤以下", id="zh-decimal"),
        pytest.param("预算1w", "预算10000", id="w-suffix"),
        # words that only look like numbers keep their meaning
        pytest.param("我们一起去看一下", "我们一起去看一下", id="yiqi-yixia"),
        pytest.param("十分感谢", "十分感谢", id="shifen-adverb"),
        pytest.param("千万别去", "千万别去", id="qianwan-adverb"),
        pytest.param("重量再轻一点", "重量再轻一点", id="yidian-a-little"),
        pytest.param("两三天", "两三天", id="approximate-range"),
        pytest.param("百度一下", "百度一下", id="brand"),
        pytest.param("五一假期去苏州", "五一假期去苏州", id="holiday"),
        pytest.param("统一口径", "统一口径", id="inside-word"),
        pytest.param("九转大肠", "九转大肠", id="dish-name"),
        pytest.param("住在十渡镇", "住在十渡镇", id="place-name"),
        pytest.param("周一开会", "周一开会", id="weekday"),
        pytest.param("4K屏幕", "4k屏幕", id="resolution-not-4000"),
        pytest.param("8kg", "8kg", id="kilograms"),
        pytest.param("65w充电器", "65w充电器", id="watts-not-wan"),
        pytest.param("2w以内", "20000以内", id="w-before-ceiling"),
        pytest.param("return it after forty-five days", "return it after 45 days", id="en-compound"),
        pytest.param("twenty one tips", "21 tips", id="en-compound-spaced"),
        pytest.param("ninety days", "90 days", id="en-tens"),
    ],
)
def test_numbers_and_units(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "帮我推荐一款适合编程的轻薄本，预算八千以内！",
        "Plan a 3-day trip to Hangzhou, budget 8k , please...",
        "三点五公斤、两万五、一百块、第二天",
        "  ｆｕｌｌ－ｗｉｄｔｈ　ＡＢＣ１２３　。",
        "帮我找一家卖九转大肠的小店",  # converting 一家 must not expose 九转 on a second pass
        "推荐菜有 煎饺 , ，你觉得怎么样？",
    ],
)
def test_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once


@pytest.mark.parametrize(
    ("text", "kept", "gone"),
    [
        pytest.param("Today is 2025-06-20 14:30.", "<date>", "2025", id="iso-date-time"),
        pytest.param("今天是2025年6月20日，星期五", "<date>", "6月20日", id="zh-date"),
        pytest.param("Current user: Alice Smith. Be polite.", "<name>", "alice", id="current-user"),
        pytest.param("当前用户：张三。请礼貌回答", "<name>", "张三", id="zh-user"),
        pytest.param("request id: 9f1c2e7a-1b2c-4d5e-8f90-123456789abc", "<id>", "9f1c2e7a", id="uuid"),
        pytest.param("Contact bob@example.com for help", "<email>", "bob@example.com", id="email"),
        pytest.param("Order number 12345678 is ready", "<num>", "12345678", id="long-number"),
        pytest.param("It is June 20, 2025 now", "<date>", "june", id="english-date"),
        pytest.param("trace token a8f3k29dk2l1x9q", "<id>", "a8f3k29dk2l1x9q", id="opaque-token"),
    ],
)
def test_mask_volatile(text: str, kept: str, gone: str) -> None:
    masked = mask_volatile(normalize_text(text))
    assert kept in masked
    assert gone not in masked


def test_mask_volatile_keeps_the_instructions() -> None:
    masked = mask_volatile(normalize_text("You are a travel assistant. Current user: Bob. Answer in 3 sentences."))
    assert masked.startswith("you are a travel assistant")
    assert "answer in 3 sentences" in masked


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param(
            "You are a helpful assistant. Today is 2025-06-20. Current user: Alice.",
            "You are a helpful assistant. Today is 2025-07-01. Current user: Bob.",
            True,
            id="volatile-parts-only",
        ),
        pytest.param(
            "你是旅行助手。今天是2025年6月20日。用户名：张三",
            "你是旅行助手。今天是2025年7月2日。用户名：李四",
            True,
            id="zh-volatile-parts-only",
        ),
        pytest.param("You are a helpful assistant.", "You are a helpful assistant!", True, id="punctuation"),
        pytest.param("You are a travel assistant.", "You are a legal assistant.", False, id="other-template"),
        pytest.param("Answer in English.", "Answer in French.", False, id="other-instruction"),
    ],
)
def test_system_prompt_version(a: str, b: str, same: bool) -> None:
    va, vb = system_prompt_version(normalize_text(a)), system_prompt_version(normalize_text(b))
    assert len(va) == 16
    assert int(va, 16) >= 0
    assert (va == vb) is same


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("It is\n01223  244277.", "It is 01223 244277."),
        ("  indented\tlist\n\n- one\r\n- two ", "indented list - one - two"),
        ("Café, ＬＧ！", "Café, ＬＧ！"),  # only whitespace: case, width and punctuation stay as shown
        ("", ""),
    ],
)
def test_fold_space(text: str, folded: str) -> None:
    assert fold_space(text) == folded


def test_a_text_is_tagged_from_its_one_cut_and_a_name_the_dictionary_lacks_reads_as_a_name() -> None:
    seg = default_segmenter()
    text = "蔡瑁还有个儿子，名叫蔡讽。我明天去北京出差"
    pairs = tagged_words(seg, text)
    assert [word for word, _ in pairs] == seg.words(text)  # the tagger does not cut again
    flags = dict(pairs)
    assert flags["北京"] == "ns" and flags["明天"] == "t"  # the dictionary's
    assert "蔡讽" not in seg._pos.word_tag_tab and flags["蔡讽"] == "nr"  # the tagger's, of the word alone
    assert seg.tag([" ", ""]) == [(" ", "x"), ("", "x")]
