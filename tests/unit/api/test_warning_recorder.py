"""The one warning recorder used by admission webhooks, policies and the front end."""

import asyncio

from kubeplane.api.warning import TRUNCATE_AT_TOTAL, TRUNCATE_ITEM, add_warning, collecting


def test_dropped_outside_a_request() -> None:
    add_warning("nobody listens")  # no error, nothing kept
    with collecting() as warnings:
        pass
    assert warnings == []


def test_kept_once_in_order_and_empty_dropped() -> None:
    with collecting() as warnings:
        for text in ("b", "a", "", "b", "c"):
            add_warning(text)
    assert warnings == ["b", "a", "c"]


def test_nested_requests_do_not_mix() -> None:
    with collecting() as outer:
        add_warning("outer")
        with collecting() as inner:
            add_warning("inner")
    assert outer == ["outer"] and inner == ["inner"]


def test_tasks_started_in_the_request_record_into_it() -> None:
    async def main() -> list[str]:
        with collecting() as warnings:
            await asyncio.gather(asyncio.create_task(_warn("from a task")))
        return warnings

    async def _warn(text: str) -> None:
        add_warning(text)

    assert asyncio.run(main()) == ["from a task"]


def test_whole_while_under_the_total_then_everything_cut() -> None:
    first = "x" * 3000
    second = "y" * 1000
    with collecting() as warnings:
        add_warning(first)
        add_warning(second)
        assert warnings == [first, second]  # 4000 <= 4096: whole
        add_warning("z" * 500)  # over the total: replayed cut short
        assert warnings == ["x" * TRUNCATE_ITEM, "y" * TRUNCATE_ITEM, "z" * TRUNCATE_ITEM]
        add_warning("short")
        assert warnings[-1] == "short"


def test_bounded_once_truncating() -> None:
    with collecting() as warnings:
        add_warning("a" * (TRUNCATE_AT_TOTAL + 1))
        for i in range(1000):
            add_warning(f"{i:04d}" + "w" * 400)
    assert sum(len(w) for w in warnings) < TRUNCATE_AT_TOTAL + TRUNCATE_ITEM
    assert all(len(w) <= TRUNCATE_ITEM for w in warnings)
    assert warnings[0] == "a" * TRUNCATE_ITEM
