"""The generated world and corpus the demo model is trained on (no download needed).

A small world is drawn from a seed: residents with a profession, a home town, a pet and a favourite
color; professions that use a tool at a workplace and make a product; animals with a sound and a food;
towns with a landmark and a market day; rules for mixing paint colors. Two registers describe it:

* **flowing text** (the stand-in for C4/WikiText, used for perplexity): paragraphs about residents,
  towns, professions and animals, and short stories about passers-by, in varied sentence templates;
* **question/answer items** (the stand-in for Commonsense-170k, used for the task margin and zero-shot
  accuracy): a context ending in a question, one correct choice and three wrong ones. The correct answer
  follows from facts or regularities that the flowing text states (a baker uses an oven; Mara lives in
  Brookvale).

The training corpus holds flowing text and QA items written as ``"Question: {context}\\nAnswer: {choice}"``
(the PuDDing format the task-margin objective scores) so the model learns the format. Held-out splits are
drawn from separate random streams and every held-out line whose text (or question) occurs in the
training corpus is dropped, so no held-out line is trained on.

Everything is pure Python and deterministic in the seed; :func:`generate_corpus` is the entry point.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

# Each profession: (name, tool, workplace, product).
PROFESSIONS = [
    ("baker", "oven", "bakery", "bread"),
    ("farmer", "plow", "farm", "wheat"),
    ("fisher", "net", "harbor", "fish"),
    ("painter", "brush", "studio", "pictures"),
    ("carpenter", "saw", "workshop", "tables"),
    ("blacksmith", "anvil", "forge", "horseshoes"),
    ("tailor", "needle", "shop", "coats"),
    ("potter", "wheel", "pottery", "bowls"),
    ("doctor", "stethoscope", "clinic", "medicine"),
    ("teacher", "chalk", "school", "lessons"),
    ("gardener", "rake", "garden", "flowers"),
    ("miner", "pickaxe", "mine", "coal"),
    ("sailor", "compass", "ship", "maps"),
    ("cook", "pan", "kitchen", "soup"),
    ("librarian", "catalog", "library", "records"),
    ("shepherd", "crook", "meadow", "wool"),
]

# Each animal: (name, sound, food).
ANIMALS = [
    ("cat", "meows", "milk"),
    ("dog", "barks", "bones"),
    ("cow", "moos", "grass"),
    ("horse", "neighs", "oats"),
    ("sheep", "bleats", "clover"),
    ("duck", "quacks", "seeds"),
    ("pig", "grunts", "apples"),
    ("owl", "hoots", "beetles"),
    ("frog", "croaks", "flies"),
    ("lion", "roars", "meat"),
    ("bee", "buzzes", "nectar"),
    ("snake", "hisses", "eggs"),
]

COLORS = ["red", "blue", "yellow", "green", "orange", "purple", "white", "black", "gray", "pink", "brown"]

# (first, second, result) of mixing paint.
COLOR_MIXES = [
    ("blue", "yellow", "green"),
    ("red", "yellow", "orange"),
    ("red", "blue", "purple"),
    ("red", "white", "pink"),
    ("black", "white", "gray"),
    ("green", "red", "brown"),
]

TOWN_NAMES = [
    "Ashford",
    "Brookvale",
    "Cindermoor",
    "Dunmere",
    "Elmstead",
    "Foxhollow",
    "Greywater",
    "Highcombe",
    "Ivybridge",
    "Kestrel",
    "Larkspur",
    "Millbrook",
]
LANDMARKS = [
    "old bridge",
    "tall lighthouse",
    "stone castle",
    "great waterfall",
    "windmill",
    "clock tower",
    "quiet lake",
    "pine forest",
    "salt marsh",
    "red cliffs",
    "copper mine",
    "white chapel",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

FIRST_NAMES = [
    "Mara",
    "Tomas",
    "Ines",
    "Oskar",
    "Lena",
    "Pavel",
    "Nora",
    "Hugo",
    "Elsa",
    "Bruno",
    "Alma",
    "Felix",
    "Greta",
    "Ivan",
    "Julia",
    "Karl",
    "Lotte",
    "Milo",
    "Nina",
    "Otto",
    "Paula",
    "Quinn",
    "Rosa",
    "Simon",
    "Tilda",
    "Ugo",
    "Vera",
    "Wim",
    "Xenia",
    "Yusuf",
    "Zora",
    "Anton",
    "Bea",
    "Carlo",
    "Dora",
    "Emil",
    "Frida",
    "Gustav",
    "Hanna",
    "Igor",
    "Jana",
    "Kai",
    "Lia",
    "Marek",
    "Nils",
    "Olga",
    "Piet",
    "Ruth",
    "Sven",
    "Tara",
    "Ulla",
    "Viktor",
    "Wanda",
    "Yara",
    "Zeno",
    "Arne",
    "Berit",
    "Cyril",
    "Dagny",
    "Erik",
    "Fiona",
    "Gerd",
    "Hedda",
    "Ilse",
    "Jonas",
    "Kira",
    "Lars",
    "Mia",
    "Noah",
    "Oda",
    "Per",
    "Rike",
    "Stig",
    "Tove",
    "Uwe",
    "Vilma",
    "Walt",
    "Ada",
    "Ben",
    "Cleo",
    "Dirk",
    "Eva",
    "Finn",
    "Gina",
    "Hans",
    "Ida",
    "Jens",
    "Kurt",
    "Liv",
    "Max",
    "Nell",
    "Ole",
    "Pia",
    "Rolf",
    "Sara",
    "Tim",
    "Una",
    "Vito",
]

PRONOUNS = {"she": ("she", "her", "her"), "he": ("he", "him", "his")}


@dataclass(frozen=True)
class Resident:
    """A named inhabitant of the world whose facts the text states and the QA items ask about."""

    name: str
    pronoun: str
    profession: tuple[str, str, str, str]
    town: str
    pet: tuple[str, str, str]
    color: str

    @property
    def subject(self) -> str:
        return PRONOUNS[self.pronoun][0]

    @property
    def possessive(self) -> str:
        return PRONOUNS[self.pronoun][2]


@dataclass
class World:
    """Everything the corpus talks about, drawn from one seed."""

    residents: list[Resident]
    towns: dict[str, tuple[str, str]]
    """town -> (landmark, market day)."""
    passers_by: list[str]
    """Names used in stories and question contexts; never a resident's name, so no fact conflicts."""


@dataclass
class Corpus:
    """The generated data: training documents and the held-out splits (see :func:`generate_corpus`)."""

    train: list[str]
    """Training documents: flowing-text paragraphs and ``Question: ...\\nAnswer: ...`` lines."""
    text_calibration: list[str] = field(default_factory=list)
    text_test: list[str] = field(default_factory=list)
    qa_calibration: list[dict] = field(default_factory=list)
    """Items ``{"context", "choices", "label"}``."""
    qa_test: list[dict] = field(default_factory=list)


def make_world(seed: int, num_residents: int) -> World:
    """Draw residents and towns from ``seed``.

    Args:
        seed: random seed of the world.
        num_residents: how many named residents (at most half of the name pool).

    Returns:
        The world.
    """
    if not 1 <= num_residents <= len(FIRST_NAMES) // 2:
        raise ValueError(f"num_residents must be in 1..{len(FIRST_NAMES) // 2}")
    rng = random.Random(f"world-{seed}")
    names = FIRST_NAMES[:]
    rng.shuffle(names)
    landmarks = LANDMARKS[:]
    rng.shuffle(landmarks)
    towns = {town: (landmark, rng.choice(WEEKDAYS)) for town, landmark in zip(TOWN_NAMES, landmarks)}
    residents = [
        Resident(
            name=name,
            pronoun=rng.choice(["she", "he"]),
            profession=rng.choice(PROFESSIONS),
            town=rng.choice(TOWN_NAMES),
            pet=rng.choice(ANIMALS),
            color=rng.choice(COLORS),
        )
        for name in names[:num_residents]
    ]
    return World(residents=residents, towns=towns, passers_by=names[num_residents:])


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _a(word: str) -> str:
    return f"{_article(word)} {word}"


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


# --------------------------------------------------------------------------------------------------
# Flowing text: each function returns one paragraph (several sentences in varied templates and order).
# --------------------------------------------------------------------------------------------------


def resident_paragraph(rng: random.Random, resident: Resident, world: World) -> str:
    """A short biography of a resident, its facts in random order and wording."""
    r = resident
    prof, tool, workplace, product = r.profession
    pet, sound, food = r.pet
    landmark, _ = world.towns[r.town]
    facts = [
        rng.choice(
            [
                f"{r.name} lives in {r.town}.",
                f"{r.name} has lived in {r.town} for many years.",
                f"{r.name} makes {r.possessive} home in {r.town}, near the {landmark}.",
                f"In {r.town} lives {r.name}.",
                f"{r.name} comes from {r.town}.",
            ]
        ),
        rng.choice(
            [
                f"{r.name} works as {_a(prof)}.",
                f"{r.name} is {_a(prof)} by trade.",
                f"By trade, {r.name} is {_a(prof)}.",
                f"Every day {r.name} goes to the {workplace}, where {r.subject} works as {_a(prof)}.",
                f"{r.name} is {_a(prof)} and uses {_a(tool)} to make {product}.",
            ]
        ),
        rng.choice(
            [
                f"{r.name} keeps {_a(pet)} at home.",
                f"{r.name} has a pet {pet} that {sound} in the evening.",
                f"The pet of {r.name} is {_a(pet)}.",
                f"{_sentence(r.possessive)} pet {pet} eats {food} every day.",
                f"{r.name} owns {_a(pet)}.",
            ]
        ),
        rng.choice(
            [
                f"{_sentence(r.possessive)} favorite color is {r.color}.",
                f"{r.name} loves the color {r.color}.",
                f"{r.name} likes {r.color} more than any other color.",
                f"The favorite color of {r.name} is {r.color}.",
            ]
        ),
    ]
    rng.shuffle(facts)
    return " ".join(facts)


def town_paragraph(rng: random.Random, town: str, world: World) -> str:
    """A town, its landmark, its market day and some of its residents."""
    landmark, day = world.towns[town]
    sentences = [
        rng.choice(
            [
                f"{town} lies near the {landmark}.",
                f"The {landmark} stands in {town}.",
                f"Visitors to {town} come to see the {landmark}.",
            ]
        ),
        rng.choice(
            [
                f"The market in {town} opens every {day}.",
                f"In {town}, market day is {day}.",
                f"Every {day} the people of {town} meet at the market.",
            ]
        ),
    ]
    people = [r.name for r in world.residents if r.town == town]
    if people:
        rng.shuffle(people)
        shown = people[:3]
        listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
        verb = "live" if len(shown) > 1 else "lives"
        sentences.append(
            rng.choice([f"Among the people of {town} are {listed}.", f"{listed} {verb} in {town}."])
        )
    rng.shuffle(sentences)
    return " ".join(sentences)


def profession_paragraph(rng: random.Random, profession: tuple[str, str, str, str]) -> str:
    """What a profession does: its tool, workplace and product."""
    prof, tool, workplace, product = profession
    sentences = [
        rng.choice(
            [
                f"{_sentence(_a(prof))} works at the {workplace}.",
                f"The {workplace} is where {_a(prof)} works.",
                f"Every {prof} spends the day at the {workplace}.",
            ]
        ),
        rng.choice(
            [
                f"{_sentence(_a(prof))} uses {_a(tool)}.",
                f"No {prof} can work without {_a(tool)}.",
                f"The most important tool of {_a(prof)} is the {tool}.",
            ]
        ),
        rng.choice(
            [
                f"{_sentence(_a(prof))} makes {product}.",
                f"With {_a(tool)}, {_a(prof)} makes {product}.",
                f"People buy {product} from the {prof}.",
            ]
        ),
    ]
    rng.shuffle(sentences)
    return " ".join(sentences)


def animal_paragraph(rng: random.Random, animal: tuple[str, str, str]) -> str:
    """What an animal sounds like and eats."""
    name, sound, food = animal
    sentences = [
        rng.choice(
            [
                f"{_sentence(_a(name))} {sound}.",
                f"When {_a(name)} is happy, it {sound}.",
                f"You can hear that {_a(name)} is near because it {sound}.",
            ]
        ),
        rng.choice(
            [
                f"{_sentence(_a(name))} eats {food}.",
                f"The favorite food of {_a(name)} is {food}.",
                f"If {_a(name)} is hungry, give it {food}.",
            ]
        ),
    ]
    rng.shuffle(sentences)
    return " ".join(sentences)


def color_paragraph(rng: random.Random) -> str:
    """One or two rules about mixing paint."""
    sentences = []
    for first, second, result in rng.sample(COLOR_MIXES, 2):
        if rng.random() < 0.5:
            first, second = second, first
        sentences.append(
            rng.choice(
                [
                    f"If you mix {first} and {second} paint, you get {result}.",
                    f"{_sentence(first)} mixed with {second} makes {result}.",
                    f"A painter who mixes {first} with {second} gets {result}.",
                ]
            )
        )
    return " ".join(sentences)


def story_paragraph(rng: random.Random, world: World) -> str:
    """A short story about a passer-by that applies the world's regularities."""
    name = rng.choice(world.passers_by)
    pronoun = rng.choice(["she", "he"])
    subject, _, possessive = PRONOUNS[pronoun]
    prof, tool, workplace, product = rng.choice(PROFESSIONS)
    animal, sound, food = rng.choice(ANIMALS)
    town = rng.choice(TOWN_NAMES)
    landmark, day = world.towns[town]
    first, second, result = rng.choice(COLOR_MIXES)
    day_word = rng.choice(WEEKDAYS)
    pool = [
        f"One {day_word} morning, {name} the {prof} walked to the {workplace} with {_a(tool)}.",
        f"{name} is {_a(prof)}, so {subject} took {possessive} {tool} and made {product}.",
        f"On the way {subject} met {_a(animal)} that {sound} loudly, so {subject} gave it some {food}.",
        f"{name} travelled to {town} and looked at the {landmark}.",
        f"Because it was {day}, the market in {town} was open.",
        f"Later {name} mixed {first} and {second} paint and got {result}.",
        f"{_sentence(possessive)} {animal} {sound} until {subject} fed it {food}.",
    ]
    chosen = rng.sample(pool, rng.randint(3, 5))
    return " ".join(chosen)


# --------------------------------------------------------------------------------------------------
# Question/answer items: (context, correct answer, pool of wrong answers).
# --------------------------------------------------------------------------------------------------


def _rule_question(rng: random.Random, world: World) -> tuple[str, str, list[str]]:
    """A question whose answer follows from a general regularity stated in the text."""
    name = rng.choice(world.passers_by)
    prof, tool, workplace, product = rng.choice(PROFESSIONS)
    animal, sound, food = rng.choice(ANIMALS)
    town = rng.choice(TOWN_NAMES)
    landmark, day = world.towns[town]
    kind = rng.randrange(8)
    if kind == 0:
        context = rng.choice(
            [
                f"{name} is {_a(prof)}. Which tool does {name} use at work?",
                f"{name} works as {_a(prof)}. What does {name} need every day?",
            ]
        )
        return context, tool, [p[1] for p in PROFESSIONS]
    if kind == 1:
        context = rng.choice(
            [
                f"{name} works as {_a(prof)}. Where does {name} go every morning?",
                f"{name} is {_a(prof)}. Where does {name} work?",
            ]
        )
        return context, f"the {workplace}", [f"the {p[2]}" for p in PROFESSIONS]
    if kind == 2:
        context = rng.choice(
            [
                f"{name} is {_a(prof)}. What does {name} make?",
                f"{name} works as {_a(prof)}. What do people buy from {name}?",
            ]
        )
        return context, product, [p[3] for p in PROFESSIONS]
    if kind == 3:
        context = rng.choice(
            [
                f"{name} has {_a(animal)}. What does the {animal} do when it is happy?",
                f"{name} hears {_a(animal)} nearby. What sound does it make?",
            ]
        )
        return context, f"it {sound}", [f"it {a[1]}" for a in ANIMALS]
    if kind == 4:
        context = rng.choice(
            [
                f"The {animal} of {name} is hungry. What should {name} give it?",
                f"{name} finds a hungry {animal}. What does the {animal} eat?",
            ]
        )
        return context, food, [a[2] for a in ANIMALS]
    if kind == 5:
        first, second, result = rng.choice(COLOR_MIXES)
        if rng.random() < 0.5:
            first, second = second, first
        context = rng.choice(
            [
                f"{name} mixes {first} paint with {second} paint. Which color does {name} get?",
                f"What color do you get when you mix {first} and {second}? {name} wants to know.",
            ]
        )
        return context, result, COLORS
    if kind == 6:
        context = rng.choice(
            [
                f"{name} visits {town}. What can {name} see there?",
                f"{name} travels to {town}. Which sight is in that town?",
            ]
        )
        return context, f"the {landmark}", [f"the {lm}" for lm in LANDMARKS]
    context = rng.choice(
        [
            f"{name} wants to go to the market in {town}. On which day should {name} go?",
            f"On which day is the market open in {town}? {name} asks.",
        ]
    )
    return context, day, WEEKDAYS


def _fact_question(rng: random.Random, resident: Resident, kind: int) -> tuple[str, str, list[str]]:
    """A question about one resident (``kind`` 0..4: town, profession, pet, color, tool)."""
    r = resident
    if kind == 0:
        context = rng.choice(
            [
                f"Where does {r.name} live?",
                f"In which town does {r.name} live?",
                f"Which town is home to {r.name}?",
            ]
        )
        return context, r.town, TOWN_NAMES
    if kind == 1:
        context = rng.choice(
            [
                f"What is the job of {r.name}?",
                f"What does {r.name} work as?",
                f"Which trade does {r.name} have?",
            ]
        )
        return context, _a(r.profession[0]), [_a(p[0]) for p in PROFESSIONS]
    if kind == 2:
        context = rng.choice(
            [
                f"Which pet does {r.name} keep?",
                f"What animal does {r.name} own?",
                f"What kind of pet does {r.name} have?",
            ]
        )
        return context, _a(r.pet[0]), [_a(a[0]) for a in ANIMALS]
    if kind == 3:
        context = rng.choice(
            [
                f"What is the favorite color of {r.name}?",
                f"Which color does {r.name} love?",
                f"Which color does {r.name} like best?",
            ]
        )
        return context, r.color, COLORS
    context = rng.choice([f"Which tool does {r.name} use at work?", f"What does {r.name} need to work?"])
    return context, r.profession[1], [p[1] for p in PROFESSIONS]


FACT_KINDS = 5
# Share of all possible question contexts kept out of training; held-out items use only these, so they
# ask about the same world (often the same resident fact, worded differently) without being trained on.
RESERVED_SHARE = 0.25


def make_item(rng: random.Random, context: str, answer: str, pool: list[str], num_choices: int) -> dict:
    """A multiple-choice item: ``answer`` plus distinct wrong choices from ``pool``, shuffled."""
    wrong = rng.sample([option for option in dict.fromkeys(pool) if option != answer], num_choices - 1)
    choices = wrong + [answer]
    rng.shuffle(choices)
    return {"context": context, "choices": choices, "label": choices.index(answer)}


def qa_line(context: str, answer: str) -> str:
    """An item in the PuDDing scoring format, as it appears in the training corpus."""
    return f"Question: {context}\nAnswer: {answer}"


def _question(rng: random.Random, world: World, fact_share: float) -> tuple[str, str, list[str]]:
    if rng.random() < fact_share:
        return _fact_question(rng, rng.choice(world.residents), rng.randrange(FACT_KINDS))
    return _rule_question(rng, world)


def _text_document(rng: random.Random, world: World) -> str:
    roll = rng.random()
    if roll < 0.35:
        return resident_paragraph(rng, rng.choice(world.residents), world)
    if roll < 0.45:
        return town_paragraph(rng, rng.choice(TOWN_NAMES), world)
    if roll < 0.55:
        return profession_paragraph(rng, rng.choice(PROFESSIONS))
    if roll < 0.65:
        return animal_paragraph(rng, rng.choice(ANIMALS))
    if roll < 0.72:
        return color_paragraph(rng)
    return story_paragraph(rng, world)


def _text_line(rng: random.Random, world: World, paragraphs: int) -> str:
    return " ".join(_text_document(rng, world) for _ in range(paragraphs))


def is_reserved(context: str, seed: int, share: float = RESERVED_SHARE) -> bool:
    """Whether a question context belongs to the held-out side (a stable hash, so both sides agree)."""
    digest = hashlib.sha256(f"{seed}:{context}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def generate_corpus(
    seed: int,
    num_residents: int,
    train_text_documents: int,
    train_qa_documents: int,
    held_out_text: int,
    held_out_qa: int,
    fact_share: float = 0.4,
    num_choices: int = 4,
) -> Corpus:
    """Generate the training corpus and the four held-out splits.

    Args:
        seed: seed of the world and of every random stream.
        num_residents: named residents in the world.
        train_text_documents: flowing-text documents (one to three paragraphs) in the training corpus.
        train_qa_documents: ``Question/Answer`` lines in the training corpus.
        held_out_text: lines in each of ``text_calibration`` and ``text_test`` (three paragraphs each).
        held_out_qa: items in each of ``qa_calibration`` and ``qa_test``.
        fact_share: share of QA items that ask about a resident (the rest apply a general rule).
        num_choices: choices per QA item (one correct).

    Returns:
        The corpus; no held-out text line occurs in ``train``, and held-out questions use only reserved
        contexts (:func:`is_reserved`), which no training document contains.
    """
    world = make_world(seed, num_residents)
    train_rng = random.Random(f"train-{seed}")
    # Training documents hold one to three paragraphs, held-out lines three: held-out lines are drawn from
    # separate random streams and any that equals a training document is dropped below.
    train = [_text_line(train_rng, world, train_rng.randint(1, 3)) for _ in range(train_text_documents)]
    while len(train) < train_text_documents + train_qa_documents:
        context, answer, _pool = _question(train_rng, world, fact_share)
        if not is_reserved(context, seed):
            train.append(qa_line(context, answer))
    train_rng.shuffle(train)
    train_set = set(train)

    corpus = Corpus(train=train)
    for split, stream in (("text_calibration", "text-cal"), ("text_test", "text-test")):
        rng = random.Random(f"{stream}-{seed}")
        lines: list[str] = getattr(corpus, split)
        seen = set(corpus.text_calibration)
        while len(lines) < held_out_text:
            line = _text_line(rng, world, paragraphs=3)
            if line not in train_set and line not in seen:
                seen.add(line)
                lines.append(line)
    for split, stream in (("qa_calibration", "qa-cal"), ("qa_test", "qa-test")):
        rng = random.Random(f"{stream}-{seed}")
        items: list[dict] = getattr(corpus, split)
        seen_contexts = {item["context"] for item in corpus.qa_calibration}
        attempts = 0
        while len(items) < held_out_qa:
            attempts += 1
            if attempts > 200 * held_out_qa:
                raise ValueError("cannot draw enough held-out QA items that differ from the training ones")
            context, answer, pool = _question(rng, world, fact_share)
            if not is_reserved(context, seed) or context in seen_contexts:
                continue
            seen_contexts.add(context)
            items.append(make_item(rng, context, answer, pool, num_choices))
    return corpus
