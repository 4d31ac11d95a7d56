"""Which models compete for a series, given its step, its seasons and how much history exists."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

from predictor.model_names import DAY, known_models, season_name
from predictor.models.autoregressive import RECENT_WINDOWS, AutoregressiveModel
from predictor.models.base import ForecastModel
from predictor.models.boosted import BoostedTreesModel
from predictor.models.calendar import CalendarRegressionModel
from predictor.models.ensemble import Combination
from predictor.models.ets import ETSModel
from predictor.models.hierarchy import AggregatedModel, TemporalHierarchy, hierarchy_levels
from predictor.models.mstl import MSTLModel
from predictor.models.naive import NaiveModel, SeasonalNaiveModel
from predictor.models.recent_level import RecentLevelModel
from predictor.models.seasonal_blend import SeasonalBlendModel
from predictor.models.seasonal_level import SeasonalLevelModel
from predictor.models.seasonal_mean import SeasonalMeanModel
from predictor.models.sequence import SequenceModel
from predictor.models.tracking import TrackingCombination

BASELINES = ("naive", "seasonal_naive_daily", "seasonal_naive_weekly")
MAX_ETS_PERIOD = 200
MAX_SEQUENCE_WINDOW = 24

ModelFactory = Callable[[], ForecastModel]
# Members of the median ensemble that count more than once.
MEDIAN_VOTES = {"seasonal_mean": 2}
# Offered only when a target names it: a GRU fit costs far more than any other model's and,
# on the bench's series, earns nothing over them; the tracking combination improved the design
# windows a little and lost on the check windows; the boosted trees, as a member of the median,
# moved design and check by 0.003 while doubling an update's cost; the temporal hierarchy, as a
# member of the median, moved the check by 0.003 and earned about what a second vote for
# `seasonal_mean` does, at half again an update's cost (docs/predictor-accuracy.md).
ON_REQUEST = ("gru", "tracking", "boosted", "hierarchy")

log = logging.getLogger(__name__)


def usable_seasons(
    step_seconds: float, seasons_seconds: Sequence[float], n_points: int
) -> list[tuple[str, int]]:
    """(name, period in steps) for seasons with at least two full cycles of history.

    Two cycles, because one cycle of a seasonal copy leaves nothing to check it against (and
    the issue asks for a weekly lag only with two weeks of history).
    """
    out = []
    for seconds in sorted(seasons_seconds):
        period = round(seconds / step_seconds)
        if period >= 2 and n_points >= 2 * period:
            out.append((season_name(seconds), period))
    return out


def shortest_cycle(step_seconds: float, seasons_seconds: Sequence[float], n_points: int) -> int:
    """The shortest usable season in steps (0 without one): how long a selection window must
    be to score every phase of the series' cycle."""
    return min((p for _, p in usable_seasons(step_seconds, seasons_seconds, n_points)), default=0)


def is_baseline(name: str) -> bool:
    """The last value and the seasonal copies: always computed, whatever ``models`` says."""
    return name == "naive" or name.startswith("seasonal_naive_")


def candidate_factories(
    step_seconds: float,
    seasons_seconds: Sequence[float],
    max_horizon: int,
    n_points: int,
    include: Sequence[str] = (),
) -> dict[str, ModelFactory]:
    """Factories for every model that can run on ``n_points`` of history, by model name.

    Baselines (naive and the seasonal copies) are always in; ``include`` restricts the rest.
    A name in ``include`` that no history could make available is a ValueError; one that only
    needs more history (a seasonal model before two cycles of its season) is logged and left
    out until then, so the baselines carry the forecast meanwhile.
    """
    seasons = usable_seasons(step_seconds, seasons_seconds, n_points)
    periods = [p for _, p in seasons]
    day_period = round(DAY / step_seconds)
    factories: dict[str, ModelFactory] = {"naive": lambda: NaiveModel(max_horizon)}
    for name, period in seasons:
        factories[f"seasonal_naive_{name}"] = partial(
            SeasonalNaiveModel, period, max_horizon, name=f"seasonal_naive_{name}"
        )
    longest = seasons[-1] if seasons else None
    if longest is not None:
        name, period = longest
        # Compare the last day (or a seventh of the season) with the same stretch a season ago.
        level_window = max(1, min(period, day_period if day_period < period else period // 7 or 1))
        factories["seasonal_level"] = lambda: SeasonalLevelModel(
            period, level_window, max_horizon, name="seasonal_level"
        )
        # The two longest seasons, each with the next shorter one (or a seventh of it) as the
        # window its level is measured over.
        blend = tuple((p, periods[i - 1] if i else max(1, p // 7)) for i, p in enumerate(periods))[
            -2:
        ]
        if max_horizon < min(p for p, _ in blend):
            factories["seasonal_blend"] = lambda: SeasonalBlendModel(blend, max_horizon)
            factories["seasonal_mean"] = lambda: SeasonalMeanModel(
                tuple(p for p, _ in blend), max_horizon
            )
    else:
        # Without a season the level of the last points is the natural guess; with one, the
        # seasonal models above carry the level and the shape both.
        factories["recent_level"] = lambda: RecentLevelModel(max_horizon)
    ets_periods = tuple(p for p in periods if p <= MAX_ETS_PERIOD)
    factories["ets_log"] = lambda: ETSModel(max_horizon, periods=ets_periods, log=True)
    factories["mstl"] = lambda: MSTLModel(max_horizon, periods=tuple(periods))
    # Recent means longer than a sixth of the shortest season blur its shape into the level
    # (and cost coefficients a short history cannot estimate).
    recent = tuple(w for w in RECENT_WINDOWS if not periods or w <= min(periods) // 6)
    factories["autoregressive"] = lambda: AutoregressiveModel(
        max_horizon, periods=tuple(periods), recent_windows=recent
    )
    factories["calendar"] = lambda: CalendarRegressionModel(
        max_horizon, periods=tuple(periods), recent_windows=recent
    )
    # Trees on the calendar and on recent and seasonal lags, when named and only where a season
    # is usable: their hour and day features and seasonal lags are the point, and on the short
    # seasonless series (a few hundred points) they lost to the median on the design windows (as
    # a member too). Named, they also join the median ensemble, where their gain was.
    if longest is not None and "boosted" in include:
        factories["boosted"] = lambda: BoostedTreesModel(
            max_horizon, periods=tuple(periods), recent_windows=recent or RECENT_WINDOWS[:1]
        )
    # `seasonal_mean` forecast at every level of a temporal hierarchy (blocks of 1, 2, 4 and 8
    # steps for 8 horizons, each with the seasons that divide into whole blocks) and reconciled,
    # when named and where a season is usable: the seasonal average is the one model cheap and
    # sound on a few dozen blocks. Named, it also joins the median ensemble, where its gain was
    # ("Eighth round" of docs/predictor-accuracy.md).
    if "seasonal_mean" in factories and "hierarchy" in include:
        factories["hierarchy"] = partial(
            temporal_hierarchy, factories["seasonal_mean"], tuple(periods), max_horizon
        )
    if "gru" in include:
        gru_window = int(min(MAX_SEQUENCE_WINDOW, max(2 * max_horizon, min(periods or [24]))))
        factories["gru"] = lambda: SequenceModel(
            max_horizon, window=gru_window, periods=tuple(periods)
        )

    # The median of members of different kinds (smoothing, decomposition, seasonal copies and
    # averages, regressions, trees, a temporal hierarchy), whose errors partly cancel; with a
    # season the naive copy is left out: it is far off beyond the first step. Without one, the
    # recent level stands in for the naive copy: the same guess with a burst's noise averaged
    # away.
    members = [
        "ets_log",
        "mstl",
        "autoregressive",
        "calendar",
        "seasonal_level",
        "seasonal_blend",
        "seasonal_mean",
        "boosted",
        "hierarchy",
    ]
    if longest is None:
        members = ["ets_log", "autoregressive", "recent_level"]
    singles = dict(factories)
    members = [n for n in members if n in singles]
    # `seasonal_mean` votes twice in the median: chosen on the design windows, it also held on
    # the check windows ("Eighth round" of docs/predictor-accuracy.md).
    votes = {n: v for n, v in MEDIAN_VOTES.items() if n in members}

    def combination(
        rule: str, name: str, names: list[str], votes: dict[str, int] | None = None
    ) -> ForecastModel:
        return Combination([singles[n]() for n in names], name=name, rule=rule, votes=votes)

    factories["ensemble"] = lambda: combination("median", "ensemble", members, votes)
    # Dropping the highest and lowest of four leaves the mean of the middle two: the median.
    if len(members) >= 5:
        factories["ensemble_trimmed"] = lambda: combination(
            "trimmed_mean", "ensemble_trimmed", members
        )
    # Every single model may join the inverse-error combination; the best seasonal copy always
    # does (see predictor.models.ensemble).
    factories["combination"] = lambda: combination("inverse_error", "combination", list(singles))
    # Every single model and the median ensemble, re-weighted after every point by how close
    # each came lately (predictor.models.tracking).
    if "tracking" in include:
        factories["tracking"] = lambda: TrackingCombination(
            [singles[n]() for n in singles],
            median_of=[n for n in members for _ in range(votes.get(n, 1))],
        )
    if include:
        known = known_models(seasons_seconds)
        unknown = sorted(set(include) - set(known))
        if unknown:
            raise ValueError(f"unknown model {unknown[0]!r}; choose from: {', '.join(known)}")
        waiting = [name for name in include if name not in factories]
        if waiting:
            shortest = min((round(s / step_seconds) for s in seasons_seconds), default=0)
            log.info(
                "requested models not available yet; the baselines forecast until they are",
                extra={
                    "models": waiting,
                    "points": n_points,
                    "needed_points": 2 * shortest if shortest >= 2 else None,
                    "reason": "seasonal models need two cycles of the shortest season",
                },
            )
        factories = {k: f for k, f in factories.items() if is_baseline(k) or k in include}
    return factories


def temporal_hierarchy(
    base: ModelFactory, periods: tuple[int, ...], max_horizon: int
) -> TemporalHierarchy:
    """``base`` at the steps and `seasonal_mean` on the sums of blocks at every higher level
    of the hierarchy (see predictor.models.hierarchy), with the seasons (at most the two
    longest) that hold a whole number of blocks and more blocks than the level forecasts."""
    members = [base()]
    for level in hierarchy_levels(max_horizon)[1:]:
        blocks = max_horizon // level
        seasons = tuple(p // level for p in periods if p % level == 0 and p // level > blocks)
        if seasons:
            members.append(
                AggregatedModel(level, max_horizon, partial(SeasonalMeanModel, seasons[-2:]))
            )
    return TemporalHierarchy(members)
