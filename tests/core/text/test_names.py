"""proxy/core/text/names.py: names the gazetteer may not know, told apart by their spelling."""

from __future__ import annotations

import pytest

from proxy.core.text.names import names_differ, names_in


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("May I have the phone number?", False),
        ("OK, please give me directions via a route that avoids all heavy traffic.", False),
        ("Yes please. I need it.", False),
        ("What is the best way to learn the Rust programming language quickly", True),
        ("call Jack please", True),
        ("Is there an ATM nearby?", True),
        ("Book it for 5pm", True),
        ("帮我查一下", True),  # no capitals to tell a name by: always taken as naming
    ],
)
def test_names_in(raw: str, names: bool) -> None:
    assert names_in(raw) is names


@pytest.mark.parametrize(
    ("a", "b", "differ"),
    [
        ("From Mexico City to Prague by train?", "From Mexico City to Marrakech by train?", True),
        ("Best time to visit Japan or Korea?", "Best time to visit Japan or Thailand?", True),
        ("How do I get a US visa?", "How do I get an American visa?", False),  # no place it goes to
        ("how safe is mexico city for a woman on her own?", "How safe is Mexico City for a woman on her own?", False),
        ("What is a good gift for a coworker?", "What's a good gift for a coworker?", False),  # no names
        ("I need a hotel.", "I'd like a hotel.", False),  # I is no name
        # in Chinese, a word in Latin letters is a name
        (
            "Prosipho crassicostatus 是一种海螺、真正的蛾螺科腹足类软体动物，也属海洋蛾螺。",
            "Notoficula signeyensis 是一种海螺，属于峨螺科的真正腹足类软体动物，海军。",
            True,
        ),
        ("帮我给spring boot服务写个dockerfile", "帮我给Vue前端写个Dockerfile", True),
        ("OPPO手机怎样能省电", "vivo手机怎么省电", True),
        ("OPPO手机怎样能省电", "手机怎么省电", False),  # only one names it in Latin letters
        ("hashmap和hashtable有什么区别", "能讲讲HashMap和Hashtable的区别吗", False),
        ("为了省钱买翻新Kindle有什么风险", "Kindle买翻新的靠谱吗", False),
        ("支付宝app怎么改密码", "支付宝怎么修改密码", False),
        ("北京有什么好玩的", "北京哪里好玩", False),
    ],
)
def test_names_differ_where_a_name_is_not_on_both_sides(a: str, b: str, differ: bool) -> None:
    assert names_differ(a, b) is differ
