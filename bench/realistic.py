"""Realistic evaluation data for the quality benchmark: dashboard payloads, report sections and
agent questions over a tenant's table, written from hand-made lists of ordinary business
vocabulary (companies, products, places, metric names with their units, periods) in several
languages and scripts, the kind of first-day data users send.  Deterministic by seed.

None of it is drawn from what training draws: every name here is outside domain/payload.py's and
domain/draws.py's lists (TENANTS, REGIONS, SEGMENTS, METRICS, CUSTOM_METRICS, PERIODS, report.TITLES),
and most names and periods are outside the API's old ASCII grammar that wild_payload and wild_task
draw from (tests/bench/test_realistic.py holds both).  Names are NFC, 1-80 characters, canonical
(domain/grammar.py canonical), without control characters or the characters the payload text
and a tool call use as separators (| : ; " < >).

It knows nothing of the model, the tokenizer or the API's grammar of the day: it does not check
`grammar.valid` (the grammar is being widened to these names), nor the benchmark's length limit
(bench/quality.py redraws an example that is too long).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from domain import agent, narrative, report
from domain.payload import STYLES, Breakdown, Metric, Payload
from domain.tools import Store, calc, call_text

# ---- vocabulary ---------------------------------------------------------------------------

COMPANIES: tuple[str, ...] = (
    "Tailspin Toys", "Fourth Coffee", "Contoso Pharmaceuticals", "Fabrikam Residences", "Adventure Works Cycles",
    "Wide World Importers", "Alpine Ski House", "Blue Yonder Airlines", "Coho Winery", "Margie's Travel",
    "Lucerne Publishing", "Woodgrove Bank", "Trey Research", "Humongous Insurance", "Proseware, Inc.",
    "O'Brien & Daughters Ltd.", "Smith/Jones Consulting", "Harbour Lights Marine (UK) Ltd", "Bright Harbor Logistics",
    "Greenfield Organic Farms Co-op", "3D Print Hub", "Müller GmbH", "Bäckerei Schäfer & Söhne KG",
    "Société Générale des Eaux", "Les Éditions du Marais S.A.", "Acier (Lorraine) SARL",
    "Construcciones Peña y Hermanos S.L.", "Café São Paulo Ltda", "Vinhos do Douro, Lda.", "Pasticceria Ferraro S.r.l.",
    "Przedsiębiorstwo Handlowe Łódź sp. z o.o.", "Güneş Tekstil A.Ş.", "Nordlys Fiskeri AS", "Kahvila Väinämöinen Oy",
    "株式会社さくら商事", "有限会社山田製作所", "北京东方贸易有限公司", "台灣優質茶業股份有限公司", "주식회사 한빛소프트",
    "ООО «Северный ветер»", "АО Уральские самоцветы", "شركة النخيل للتجارة", "मेहता एंड संस प्राइवेट लिमिटेड",
    "Ελληνικά Γαλακτοκομεία Α.Ε.", "חברת הגליל בע״מ", "บริษัท สยามฟู้ด จำกัด", "Công ty TNHH Hoa Sen",
    # long ones (60-80 characters), as registered names are
    "The Greater Manchester Independent Booksellers Cooperative Society Ltd",
    "Compagnie Française des Transports Maritimes et Fluviaux (CFTMF) S.A.",
    "Vereinigte Norddeutsche Landmaschinen- und Traktorenwerke GmbH & Co. KG",
)

PRODUCTS: tuple[str, ...] = (
    "Espresso Roast 1 kg", "Trail Runner X2", "Cloud Backup Pro", "Ergo Desk Chair 300", "Premium Support Plan",
    "Starter Kit, Blue", "Solar Panel 400 W", "Gift Card (EUR 50)", "Adult Dog Food – 12 kg", "Noise-Cancelling Headphones",
    "Wireless Mouse M/2", "Organic Oat Milk 1 L", "Enterprise License (annual)", "Home Insurance Plus",
    "Mobile App Subscription", "Spare Parts & Accessories", "Kids' Rain Boots", "Cold Brew Concentrate",
    "Yoga Mat 6 mm", "Kaffeevollautomat CM-5", "Lavendel-Seife", "Crème brûlée (lot de 4)", "Vélo électrique Urbain",
    "Bicicleta urbana 700c", "Aceite de oliva virgen extra", "Pão de queijo congelado", "Zestaw narzędzi 120 el.",
    "Çay bardağı seti", "Fjällvandringsjacka", "抹茶ラテ", "緑茶ペットボトル 500ml", "无线耳机 Pro", "智能手表 S3",
    "김치 1kg", "한방 샴푸", "Чай чёрный «Байкал»", "Пельмени домашние", "تمر مجدول", "قهوة عربية", "मसाला चाय",
    "बासमती चावल 5 kg", "Ελαιόλαδο παρθένο", "Industrial Stainless Steel Food Processor, 3-Speed, Commercial Grade (230 V)",
)

PLACES: tuple[str, ...] = (
    "São Paulo", "Zürich", "Kraków", "İstanbul", "東京", "大阪府", "上海", "서울", "Москва", "Санкт-Петербург",
    "القاهرة", "دبي", "मुंबई", "नई दिल्ली", "Western Europe", "Île-de-France", "Baden-Württemberg", "Québec",
    "Ciudad de México", "Bogotá", "Reykjavík", "Łódź", "Αθήνα", "תל אביב-יפו", "Thành phố Hồ Chí Minh",
    "Nordrhein-Westfalen", "Greater London", "New South Wales", "Rio Grande do Sul", "Київ", "Praha", "Göteborg",
    "Genève", "Côte d'Ivoire", "Middle East & Africa", "Asia-Pacific (ex. Japan)", "Central & Eastern Europe",
    "US West Coast", "Rest of World", "North America", "Benelux", "Lombardia", "Andalucía", "Kuala Lumpur", "Nairobi",
    "Store #12, Main St.", "Online / e-commerce",
    "Provincia autonoma di Bolzano – Alto Adige / Autonome Provinz Bozen – Südtirol",
)


@dataclass(frozen=True)
class MetricKind:
    """A metric as a dashboard holds it: its name, its unit, the decimals its numbers are written
    with, the range of an ordinary value (low < 0: it can be a loss), and whether it adds up over
    a breakdown's rows (revenue does; a rate does not: its rows are rates near it)."""

    name: str
    unit: str
    decimals: int
    low: float
    high: float
    additive: bool


METRICS: tuple[MetricKind, ...] = (
    MetricKind("Monthly recurring revenue", "k€", 1, 50, 4000, True),
    MetricKind("Net promoter score", "pts", 0, -30, 80, False),
    MetricKind("Operating profit", "M USD", 2, -15, 60, True),
    MetricKind("EBITDA margin", "%", 1, -12, 35, False),
    MetricKind("Customer acquisition cost", "GBP", 2, 40, 900, False),
    MetricKind("Average handling time", "min", 1, 2, 25, False),
    MetricKind("On-time delivery", "%", 1, 70, 99.9, False),
    MetricKind("Units shipped", "units", 0, 500, 250000, True),
    MetricKind("Billable hours", "hrs", 0, 200, 40000, True),
    MetricKind("Free cash flow", "M EUR", 2, -30, 80, True),
    MetricKind("Energy consumption", "MWh", 1, 100, 9000, True),
    MetricKind("Headcount (FTE)", "FTE", 1, 20, 12000, True),
    MetricKind("Defect rate", "ppm", 0, 5, 900, False),
    MetricKind("Bookings (net new)", "k CHF", 0, 100, 25000, True),
    MetricKind("Occupancy rate", "%", 1, 40, 98, False),
    MetricKind("Revenue per available room", "€", 2, 45, 320, False),
    MetricKind("Days sales outstanding", "days", 0, 20, 95, False),
    MetricKind("Click-through rate", "%", 2, 0.2, 9, False),
    MetricKind("Average basket value", "AUD", 2, 15, 300, False),
    MetricKind("Inventory turnover", "turns", 2, 1, 15, False),
    MetricKind("Exchange rate EUR/USD", "USD", 4, 0.9, 1.4, False),
    MetricKind("Yield per hectare", "t", 3, 1, 12, False),
    MetricKind("Average speed of answer", "sec", 0, 5, 300, False),
    MetricKind("Recurring maintenance contract revenue, excluding one-off services (net)", "k€", 0, 20, 9000, True),
    MetricKind("Umsatz", "Mio. €", 2, 1, 900, True),
    MetricKind("Auftragseingang", "Stück", 0, 100, 90000, True),
    MetricKind("Krankenstand", "%", 1, 1, 12, False),
    MetricKind("Chiffre d'affaires", "k€", 0, 200, 60000, True),
    MetricKind("Taux de conversion", "%", 2, 0.3, 12, False),
    MetricKind("Panier moyen", "€", 2, 12, 250, False),
    MetricKind("Ventas netas", "MXN", 0, 10000, 9000000, True),
    MetricKind("Margen bruto", "%", 1, -5, 65, False),
    MetricKind("Receita líquida", "R$ mil", 1, 100, 90000, True),
    MetricKind("Fatturato", "€", 0, 5000, 5000000, True),
    MetricKind("Przychody ze sprzedaży", "tys. zł", 1, 100, 50000, True),
    MetricKind("Net satışlar", "₺", 0, 10000, 50000000, True),
    MetricKind("Nettoomsättning", "MSEK", 1, 5, 9000, True),
    MetricKind("売上高", "百万円", 0, 100, 900000, True),
    MetricKind("営業利益", "百万円", 0, -5000, 40000, True),
    MetricKind("营业收入", "万元", 2, 50, 90000, True),
    MetricKind("净利润", "万元", 2, -3000, 20000, True),
    MetricKind("매출액", "억원", 1, 5, 9000, True),
    MetricKind("Выручка", "млн ₽", 1, 5, 90000, True),
    MetricKind("Чистая прибыль", "тыс. ₽", 0, -50000, 400000, True),
    MetricKind("الإيرادات", "ر.س", 0, 10000, 9000000, True),
    MetricKind("राजस्व", "₹ lakh", 2, 1, 9000, True),
    MetricKind("Πωλήσεις", "€", 0, 1000, 900000, True),
    MetricKind("הכנסות", "₪", 0, 1000, 900000, True),
)

# periods in families of one format each, in time order: a tenant's table uses one format, and a
# change question goes from an earlier period of it to a later one
PERIOD_FAMILIES: tuple[tuple[str, ...], ...] = (
    ("Q1 2026", "Q2 2026", "Q3 2026", "Q4 2026"),
    ("Q3/2025", "Q4/2025", "Q1/2026"),
    ("3Q25", "4Q25", "1Q26"),
    ("Q3 FY2026", "Q4 FY2026", "Q1 FY2027"),
    ("H2 2025", "H1 2026", "H2 2026"),
    ("H1 FY26", "H2 FY26", "H1 FY27"),
    ("FY 2024/25", "FY 2025/26", "FY 2026/27"),
    ("Jan–Mar 2026", "Apr–Jun 2026", "Jul–Sep 2026"),
    ("March 2026", "April 2026", "May 2026"),
    ("Sept. 2026", "Oct. 2026", "Nov. 2026"),
    ("Week 14, 2026", "Week 15, 2026", "Week 16, 2026"),
    ("YTD 2025", "YTD 2026"),
    ("12 months to June 2025", "12 months to June 2026"),
    ("KW 13/2026", "KW 14/2026", "KW 15/2026"),
    ("Januar 2026", "Februar 2026", "März 2026"),
    ("janvier 2026", "février 2026", "mars 2026"),
    ("T1 2026", "T2 2026", "T3 2026"),
    ("enero de 2026", "febrero de 2026", "marzo de 2026"),
    ("1º trim. 2026", "2º trim. 2026", "3º trim. 2026"),
    ("I kw. 2026", "II kw. 2026", "III kw. 2026"),
    ("2026 1. Çeyrek", "2026 2. Çeyrek", "2026 3. Çeyrek"),
    ("Март 2026", "Апрель 2026", "Май 2026"),
    ("1 кв. 2026", "2 кв. 2026", "3 кв. 2026"),
    ("2026年1月", "2026年2月", "2026年3月"),
    ("2026年度第1四半期", "2026年度第2四半期", "2026年度第3四半期"),
    ("2026년 1분기", "2026년 2분기", "2026년 3분기"),
    ("01.03.–31.03.2026", "01.04.–30.04.2026"),
    # formats the old grammar also has (training draws such strings): a few, as users write them too
    ("Nov-2025", "Dec-2025", "Jan-2026"),
    ("FY2025", "FY2026", "FY2027"),
)
PERIODS: tuple[str, ...] = tuple(p for family in PERIOD_FAMILIES for p in family)

SECTION_TITLES: tuple[str, ...] = (
    "Executive summary", "Commercial highlights", "Sales by region", "Store performance", "Operations update",
    "Key figures this quarter", "Customer satisfaction", "Financial overview", "Cash & liquidity", "People and culture",
    "Supply chain", "Marketing (paid & organic)", "What changed since last month", "Umsatzentwicklung",
    "Kennzahlen im Überblick", "Synthèse commerciale", "Résultats du trimestre", "Resumen ejecutivo",
    "Desempenho comercial", "Podsumowanie sprzedaży", "Satış performansı", "業績ハイライト", "营业概况", "매출 현황",
    "Итоги квартала", "ملخص الأداء", "बिक्री सारांश", "Σύνοψη αποτελεσμάτων",
)

MAX_DIGITS = 15  # a number's digits (its significant ones: no leading zeros are written)
MAX_DECIMALS = 6
AGENT_DIGITS = 12  # a table's values: sums of three stay exact in a float to the cent (calc computes in floats)
AGENT_NAME = 64  # a dataset's name field holds at most 64 characters (runtime/jobs/datasets.py)
# how many metrics a payload has (1..8) and rows a breakdown (1..12): mostly few, as dashboards do
METRIC_WEIGHTS = (30, 28, 18, 10, 6, 4, 2, 2)
ROW_WEIGHTS = (8, 16, 18, 16, 12, 9, 7, 5, 3, 2, 2, 2)


# ---- numbers ------------------------------------------------------------------------------
# a number is an int n of units of 10**-dec, written exactly (no float formatting): "-120",
# "1020.5", "0.75", "0.00"


def fmt(n: int, dec: int) -> str:
    """n units of 10**-dec as the runtime writes a number: no "+", no separators, no leading
    zeros but the one of "0.x"; fmt(-5, 2) -> "-0.05", fmt(102050, 2) -> "1020.50"."""
    s = str(abs(n)).rjust(dec + 1, "0")
    return ("-" if n < 0 else "") + (f"{s[:-dec]}.{s[-dec:]}" if dec else s)


def _fit(n: int, digits: int) -> int:
    """n cut (towards zero, a digit at a time) to at most `digits` digits."""
    sign, a = (-1 if n < 0 else 1), abs(n)
    while len(str(a)) > digits:
        a //= 10
    return sign * a


@dataclass(frozen=True)
class _Shape:
    """How one metric's numbers are written in one payload: decimals, scale, digits."""

    dec: int
    scale: int
    digits: int


def _shape(rng: random.Random, m: MetricKind, digits: int = MAX_DIGITS, max_dec: int = MAX_DECIMALS) -> _Shape:
    """Mostly m's own decimals and size; 1 in 12 a spreadsheet export's extra decimals, 1 in 20
    a big amount where m adds up (in a small currency, or summed over years; a rate stays one),
    up to `digits` digits."""
    dec, scale = m.decimals, 1
    if rng.random() < 1 / 12:
        dec = min(max_dec, dec + rng.randint(1, 3))
    if rng.random() < 1 / 20 and m.additive:
        scale = 10 ** rng.randint(3, 8)
    return _Shape(min(dec, max_dec), scale, digits)


def _draw(rng: random.Random, m: MetricKind, s: _Shape) -> int:
    """An ordinary value of m, in units of 10**-s.dec, times s.scale (a big number)."""
    return _fit(round(rng.uniform(m.low, m.high) * s.scale * 10 ** s.dec), s.digits)


def _near(rng: random.Random, n: int, m: MetricKind, s: _Shape) -> int:
    """A second number for n (prev, target): equal 1 in 6 (flat, on target), else within +-30%
    of n or of a tenth of m's range (a loss can turn into a profit); never below zero for a
    metric that cannot be."""
    if rng.random() < 1 / 6:
        return n
    spread = max(abs(n), round((m.high - m.low) * s.scale * 10 ** s.dec / 10), 1)
    y = n + round(rng.uniform(-0.3, 0.3) * spread)
    if y == n:
        y = n + rng.choice((-1, 1))
    if m.low >= 0 and y < 0:
        y = -y
    return _fit(y, s.digits)


# ---- dashboard payloads and report sections -----------------------------------------------------


def _metric(rng: random.Random, m: MetricKind, shape: _Shape, with_target: bool) -> tuple[Metric, int]:
    n = _draw(rng, m, shape)
    prev = _near(rng, n, m, shape)
    target = fmt(_near(rng, n, m, shape), shape.dec) if with_target else None
    return Metric(m.name, fmt(n, shape.dec), fmt(prev, shape.dec), target, custom_unit=m.unit), n


def _breakdown(rng: random.Random, m: MetricKind, shape: _Shape, n: int) -> Breakdown:
    """1-12 rows of places (by region) or products (by segment), with m's decimals: a share of
    n where m adds up, else near n."""
    kind = rng.choice(("region", "segment"))
    names = rng.sample(PLACES if kind == "region" else PRODUCTS, rng.choices(range(1, 13), ROW_WEIGHTS)[0])
    rows = []
    for name in names:
        v = _fit(round(n * rng.uniform(0.03, 0.6)), shape.digits) if m.additive else _near(rng, n, m, shape)
        rows.append((name, fmt(v, shape.dec), fmt(_near(rng, v, m, shape), shape.dec)))
    return Breakdown(kind, m.name, rows)


def payload(rng: random.Random, max_metrics: int = 8) -> Payload:
    """A dashboard payload: a company, a period, a style, 1..max_metrics custom metrics (each a
    value, a prev and, 60% of the time, a target; some negative; mostly ordinary sizes, up to 15
    digits and 6 decimals; one number of decimals per metric), and, half the time, a breakdown of
    one metric by 1-12 places or products.  Its names are all distinct (the lists are disjoint)."""
    kinds = rng.sample(METRICS, rng.choices(range(1, max_metrics + 1), METRIC_WEIGHTS[:max_metrics])[0])
    shapes = [_shape(rng, m) for m in kinds]
    drawn = [_metric(rng, m, s, rng.random() < 0.6) for m, s in zip(kinds, shapes)]
    breakdown = None
    if rng.random() < 0.5:
        j = rng.randrange(len(kinds))
        breakdown = _breakdown(rng, kinds[j], shapes[j], drawn[j][1])
    return Payload(rng.choice(COMPANIES), rng.choice(PERIODS), rng.choice(STYLES), [m for m, _ in drawn], breakdown)


def section(rng: random.Random) -> report.Section:
    """A report section: a title of SECTION_TITLES over a payload of at most 2 metrics (as
    domain/report.py's sections have)."""
    return report.Section(rng.choice(SECTION_TITLES), payload(rng, max_metrics=2))


def narrative_example(rng: random.Random) -> tuple[Payload, str]:
    """A payload and a reference narrative (bench/quality.py measures its length in tokens)."""
    p = payload(rng)
    return p, narrative.narrative(rng, p)


def section_example(rng: random.Random) -> tuple[report.Section, str]:
    s = section(rng)
    return s, report.section_text(rng, s)


# ---- agent questions over a tenant's table ------------------------------------------------------

Table = dict[str, list[dict[str, str]]]  # the body of PUT /v1/datasets/{name}: {"rows": [{metric, region, period, value}]}


def table(rng: random.Random) -> Table:
    """A tenant's table as the API takes it: 1-2 metrics by 2-5 places (or, 1 in 3, products)
    by 2-4 consecutive periods of one format, every combination a row; values as a dashboard
    writes them (the metric's decimals, at most 2; some negative), at most 12 digits."""
    kinds = rng.sample([m for m in METRICS if len(m.name) <= AGENT_NAME], rng.randint(1, 2))
    pool = [n for n in (PRODUCTS if rng.random() < 1 / 3 else PLACES) if len(n) <= AGENT_NAME]
    names = rng.sample(pool, rng.randint(2, 5))
    family = rng.choice(PERIOD_FAMILIES)
    k = rng.randint(2, len(family))
    start = rng.randint(0, len(family) - k)
    periods = family[start:start + k]
    rows = []
    for m in kinds:
        shape = _shape(rng, m, digits=AGENT_DIGITS, max_dec=2)
        for name in names:
            n = _draw(rng, m, shape)
            for p in periods:  # period to period, a value moves as a dashboard's does
                rows.append({"metric": m.name, "region": name, "period": p, "value": fmt(n, shape.dec)})
                n = _near(rng, n, m, shape)
    return {"rows": rows}


def store(t: Table) -> Store:
    """The table as the agent's metric tool reads it (the runtime's Table does the same)."""
    return Store({(r["metric"], r["region"], r["period"]): r["value"] for r in t["rows"]})


def _unit(name: str) -> str:
    return next(m.unit for m in METRICS if m.name == name)


#: phrasings training never writes, per kind of question (phrased=True): what a team would ask
PHRASED = {
    "lookup": ("Show {m} for {r} in {p}.", "How much {m} did {r} have in {p}?", "Give me {m} for {r} in {p}.",
               "{m} in {r}, {p}?"),
    "change": ("What was the percent change in {m} for {r} between {p1} and {p2}?",
               "How did {m} in {r} move from {p1} to {p2}, in percent?"),
    "total": ("Add up {m} for {where} in {p}.", "What is the combined {m} of {where} in {p}?"),
    "diff": ("By how much did {m} in {r1} exceed {r2} in {p}?", "What is the gap in {m} between {r1} and {r2} in {p}?"),
}


def make_task(rng: random.Random, t: Table, phrased: bool = False) -> agent.Task:
    """A question over table t of one of domain/agent.py wild_task's four kinds (lookup, change
    in percent between two periods, total over 2-3 names, difference of two), in its phrasings
    (phrased: in one of PHRASED, which training never writes), the names as the table writes
    them; its calls and answer as the tools give them.  A change from a value that is zero or a
    loss is no percentage a reader wants: a difference instead."""
    data = store(t)
    metric = rng.choice(sorted({r["metric"] for r in t["rows"]}))
    names = list(dict.fromkeys(r["region"] for r in t["rows"]))
    periods = list(dict.fromkeys(r["period"] for r in t["rows"]))  # in time order (table() writes them so)
    tail = f" {_unit(metric)}"
    kind = rng.choice(("lookup", "change", "total", "diff"))
    r, p = rng.choice(names), rng.choice(periods)
    def ask(kind: str, ours: str, **names: str) -> str:  # the question: ours, or a phrasing of PHRASED
        return rng.choice(PHRASED[kind]).format(m=metric, **names) if phrased else ours

    if kind == "lookup":
        v = data.lookup(metric, r, p)
        q = ask("lookup", rng.choice((f"What was {metric} in {r} in {p}?", f"Look up {metric} for {r}, {p}.")), r=r, p=p)
        return agent.Task(q, [call_text("metric", metric, r, p)], v, f"{metric} in {r} in {p} was {v}{tail}.")
    if kind == "change":
        i, j = sorted(rng.sample(range(len(periods)), 2))
        p1, p2 = periods[i], periods[j]
        v1, v2 = data.lookup(metric, r, p1), data.lookup(metric, r, p2)
        if float(v1) > 0:
            expr = f"({v2}-{v1})/{v1}*100"
            res = calc(expr)
            q = ask("change", f"By how much did {metric} in {r} change from {p1} to {p2}, in percent?", r=r, p1=p1, p2=p2)
            return agent.Task(q, [call_text("metric", metric, r, p1), call_text("metric", metric, r, p2),
                                  call_text("calc", expr)], res, f"{metric} in {r} changed by {res}% from {p1} to {p2}.")
    if kind == "total":
        where_names = rng.sample(names, min(len(names), rng.randint(2, 3)))
        vals = [data.lookup(metric, x, p) for x in where_names]
        expr = "+".join(vals)
        res = calc(expr)
        where = ", ".join(where_names[:-1]) + " and " + where_names[-1]
        q = ask("total", f"What was the total {metric} across {where} in {p}?", where=where, p=p)
        return agent.Task(q, [call_text("metric", metric, x, p) for x in where_names] + [call_text("calc", expr)],
                          res, f"Total {metric} across {where} in {p} was {res}{tail}.")
    r1, r2 = rng.sample(names, 2)
    v1, v2 = data.lookup(metric, r1, p), data.lookup(metric, r2, p)
    expr = f"{v1}-{v2}"
    res = calc(expr)
    q = ask("diff", f"How much higher was {metric} in {r1} than in {r2} in {p}?", r1=r1, r2=r2, p=p)
    return agent.Task(q, [call_text("metric", metric, r1, p), call_text("metric", metric, r2, p),
                          call_text("calc", expr)], res, f"{metric} in {r1} was {res}{tail} higher than in {r2}.")


def question(rng: random.Random, t: Table) -> tuple[str, str]:
    """A question over table t and its right answer, a number as the tools write it."""
    task_ = make_task(rng, t)
    return task_.question, task_.answer


def task(rng: random.Random, phrased: bool = False) -> tuple[agent.Task, Store]:
    """A question over a new table, and the table as a store: what domain/agent.py wild_task
    returns, so bench/quality.py runs it as it runs agent_ood."""
    t = table(rng)
    return make_task(rng, t, phrased), store(t)


def agent_example(rng: random.Random, phrased: bool = False) -> tuple[agent.Task, Store, list[tuple[str, bool]]]:
    """task() and its reference transcript (bench/quality.py measures its length in tokens)."""
    task_, data = task(rng, phrased)
    return task_, data, agent.transcript(task_, data)


def phrased_example(rng: random.Random) -> tuple[agent.Task, Store, list[tuple[str, bool]]]:
    return agent_example(rng, phrased=True)
