"""Numbers, prices, years, Roman numerals and abbreviations said right (plugin/text/verbalise.py)."""

import pytest

from myna.text.verbalise import roman_value, verbalise


def say(text: str) -> str:
    return " ".join(verbalise(text.split()))


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("It costs $500 today.", "It costs five hundred dollars today."),
        ("$12.75", "twelve dollars and seventy-five cents"),
        ("$1", "one dollar"),
        ("$1.01", "one dollar and one cent"),
        ("$0.99", "ninety-nine cents"),
        ("$12.5", "twelve dollars and fifty cents"),
        ("$5,000", "five thousand dollars"),
        ("$1,250,000.50", "one million two hundred and fifty thousand dollars and fifty cents"),
        ("$1.5 million", "one point five million dollars"),
        ("$2B", "two billion dollars"),
        ("$30k", "thirty thousand dollars"),
        ("-$5", "minus five dollars"),
        ("€3.50", "three euros and fifty cents"),
        ("€3,50", "three euros and fifty cents"),
        ("5€", "five euros"),
        ("£20", "twenty pounds"),
        ("£1.01", "one pound and one penny"),
        ("£2.50", "two pounds and fifty pence"),
        ("¥100", "one hundred yen"),
        ("₹250", "two hundred and fifty rupees"),
        ("50¢", "fifty cents"),
        ("US$40", "forty dollars"),
        ("($500),", "(five hundred dollars),"),
        ("$5-10", "five to ten dollars"),
        ("$5–$10", "five to ten dollars"),
        ("$100.00", "one hundred dollars"),
        ("$0.05", "five cents"),
        ("€1,000", "one thousand euros"),
        ("£1.5m", "one point five million pounds"),
    ],
)
def test_prices_are_read_as_amounts_in_words(text, spoken):
    assert say(text) == spoken


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("in 1920", "in nineteen twenty"),
        ("since 1999,", "since nineteen ninety-nine,"),
        ("by 2030.", "by twenty thirty."),
        ("in 2005", "in two thousand and five"),
        ("in 1905", "in nineteen oh-five"),
        ("the year 1066", "the year ten sixty-six"),
        ("2024 was good", "twenty twenty-four was good"),
        ("May 5, 1990", "May 5, nineteen ninety"),
        ("the 1984 election", "the nineteen eighty-four election"),
        ("in 1800", "in eighteen hundred"),
        ("in 500 BC", "in 500 BC"),  # three digits: left to the voice
        ("the 1920s", "the nineteen twenties"),
        ("the 1900s", "the nineteen hundreds"),
        ("the '90s", "the 'nineties"),
        ("from 1914-1918", "from nineteen fourteen to nineteen eighteen"),
        ("in 2020-21", "in twenty twenty to twenty twenty-one"),
    ],
)
def test_years_are_read_as_years(text, spoken):
    assert say(text) == spoken


@pytest.mark.parametrize(
    "text",
    ["1920 people came", "He scored 2000 goals", "about 1500 points", "over 1200 miles", "nearly 2000",
     "it was -5 today", "pi is 3.14", "10:30", "50%", "5,000 people", "call 911", "room 42", "1/2 cup"],
)
def test_counts_negatives_decimals_and_other_numbers_are_left_to_the_voice(text):
    assert say(text) == text


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("World War II", "World War two"),
        ("World War I", "World War one"),
        ("Part III", "Part three"),
        ("Chapter IV.", "Chapter four."),
        ("Super Bowl LVII", "Super Bowl fifty-seven"),
        ("Type II diabetes", "Type two diabetes"),
        ("Apollo XI", "Apollo eleven"),
        ("Henry VIII", "Henry the Eighth"),
        ("Henry II", "Henry the Second"),
        ("Queen Elizabeth II,", "Queen Elizabeth the Second,"),
        ("Pope John Paul II", "Pope John Paul the Second"),
        ("Louis XIV", "Louis the Fourteenth"),
        ("Rocky II", "Rocky two"),
        ("Final Fantasy VII", "Final Fantasy seven"),
        ("Star Wars Episode IV", "Star Wars Episode four"),
    ],
)
def test_roman_numerals_after_a_numbering_word_or_a_regnal_name(text, spoken):
    assert say(text) == spoken


@pytest.mark.parametrize("text", ["I think I can", "So I did", "Washington DC", "a MIX of CD and DVD", "Malcolm X",
                                  "Elizabeth I was queen", "Vitamin C", "Plan B", "Size XL", "Give IV fluids",
                                  "an II grade"])
def test_letters_that_are_not_numerals_stay_letters(text):
    assert say(text) == text


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("Martin Luther King Jr. was born", "Martin Luther King junior was born"),
        ("John Smith Sr. said", "John Smith senior said"),
        ("Sgt. Pepper", "Sergeant Pepper"),
        ("Lt. Dan and Capt. Kirk", "Lieutenant Dan and Captain Kirk"),
        ("Mt. Everest", "Mount Everest"),
        ("Gov. Brown and Sen. Lee", "Governor Brown and Senator Lee"),
        ("cats vs. dogs", "cats versus dogs"),
        ("Take No. 5 now", "Take number 5 now"),
        ("Jan. 5", "January 5"),
        ("fruit, e.g. apples", "fruit, for example apples"),
        ("one, i.e. this", "one, that is this"),
        ("Acme Inc. is hiring", "Acme incorporated is hiring"),
        ("a Ph.D. student", "a P H D student"),
        ("WWII ended", "World War two ended"),
        ("the end, Jr.", "the end, junior."),
    ],
)
def test_abbreviations_the_voice_misreads_are_spelled_out(text, spoken):
    assert say(text) == spoken


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("Mr. Smith is here.", "Mr Smith is here."),
        ("James T. Kirk is here.", "James T Kirk is here."),
        ("The U.S. Army is here.", "The U.S Army is here."),
        ("at 10 a.m. tomorrow", "at 10 a.m tomorrow"),
        ("Dr. Lee and Mrs. Jones", "Dr Lee and Mrs Jones"),
    ],
)
def test_a_stop_that_ends_no_sentence_is_not_given_to_the_voice(text, spoken):
    assert say(text) == spoken


def test_a_stop_that_ends_a_sentence_stays():
    assert say("at 5 p.m. Then we eat.") == "at 5 p.m. Then we eat."
    assert say("for you. Your order") == "for you. Your order"


def test_context_from_the_unit_before_is_used():
    assert verbalise(["II", "ended."], previous=["in", "World", "War"]) == ["two", "ended."]
    assert verbalise(["million."], previous=["costs", "$1.5"]) == ["million dollars."]
    assert verbalise(["1920"], previous=["back", "in"]) == ["nineteen twenty"]


def test_one_form_per_written_word():
    words = "It costs $12.75 in 1920 , World War II and Henry VIII Jr. ok".split()
    forms = verbalise(words)
    assert len(forms) == len(words) and all(forms)


def test_roman_values():
    assert [roman_value(r) for r in ("II", "IV", "IX", "XIV", "XL", "MCMXC", "LVII")] == [2, 4, 9, 14, 40, 1990, 57]
