"""The embedded demo task: continue a movie-review opening; reward is VADER positivity.

Needs no dataset. The prompts, the held-out reference sentences (for perplexity) and the pretraining sentences
(for the multitask loss) were written for this project; they are three disjoint sets.
"""

from __future__ import annotations

from elastic_reset.errors import ConfigError
from elastic_reset.rewards.vader import vader_positive
from elastic_reset.tasks.base import Task, register_task

PROMPTS = [
    "I watched this movie last night and",
    "The plot of this film",
    "Honestly, the acting in this one",
    "My friends told me to see it, so",
    "The director's latest picture",
    "From the very first scene,",
    "The soundtrack of the movie",
    "I went in with low expectations and",
    "This is the kind of film that",
    "The lead actress plays a nurse who",
    "After two hours in the cinema,",
    "The special effects in this sequel",
    "It is a quiet drama about a family that",
    "The dialogue in the second half",
    "As a fan of the original book,",
    "The ending of this thriller",
    "This documentary follows a group of",
    "The villain of the story",
    "I rented this on a rainy Sunday and",
    "Compared to the first movie,",
    "The cinematography is",
    "Halfway through the film I",
    "The comedy in this movie",
    "My kids wanted to watch it, and",
    "The cast includes several famous actors, but",
    "This horror movie starts in an old house where",
    "The pacing of the story",
    "The script was written by",
    "When the credits rolled,",
    "The movie tells the story of a young man who",
    "The first act is",
    "I have seen this film three times and",
    "The critics called it a masterpiece, but",
    "This animated feature",
    "The romance between the two leads",
    "The war scenes in this picture",
    "There is a moment in the middle where",
    "The costumes and sets",
    "I expected a simple action movie, yet",
    "Overall, this film",
]

REFERENCE_TEXTS = [
    "The film opens on a small fishing town where nothing much ever happens, and it takes its time before the story "
    "begins.",
    "I thought the performances were uneven: the lead was convincing, but the supporting cast seemed lost.",
    "It is a long movie, almost three hours, and the second half drags in a way the first half never does.",
    "The music was composed by a newcomer, and it fits the slow, grey mood of the picture very well.",
    "We saw it in a nearly empty theater on a Tuesday afternoon, which may have coloured my impression.",
    "The story follows two brothers who inherit a farm and cannot agree on what to do with it.",
    "Some of the jokes land and some do not, but the timing of the older actors is excellent.",
    "The camera rarely moves, which makes the few tracking shots feel important when they come.",
    "I had read the novel years ago, and the adaptation leaves out most of the subplots.",
    "There are no heroes in this film, only people making the best of bad choices.",
    "The dialogue sounds natural, as if the actors were allowed to improvise some of the scenes.",
    "By the final act the mystery is obvious, yet the film still manages a few surprises.",
    "The effects look cheap in daylight scenes but work well in the night sequences.",
    "It was filmed on location in the mountains, and you can feel the cold in every frame.",
    "The child actors are remarkably good, and the film is at its best when it stays with them.",
    "My partner fell asleep halfway through, while I stayed curious until the very end.",
    "The editing is abrupt at times, cutting away from scenes just as they become interesting.",
    "This is a remake of a French film from the seventies, and it changes the ending.",
    "The villain is given a back story that explains his anger without excusing it.",
    "The movie was released in only a few cities, so most people will find it on television.",
    "A lot of the humour depends on knowing the earlier films in the series.",
    "The trial scenes are the strongest part, carefully written and well acted.",
    "Its colours are washed out on purpose, to make the past look like an old photograph.",
    "I left the cinema unsure whether I had liked it, and I am still thinking about it.",
]

PRETRAIN_TEXTS = [
    "The river runs through the centre of the old town and floods every few winters.",
    "She opened the window, listened to the rain, and decided to stay at home.",
    "Most of the shops on the main street close early on Sundays.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "He had worked at the station for twenty years before the trains stopped running.",
    "The library moved to a larger building after the fire destroyed the old one.",
    "In the morning the fog covered the fields, and by noon it was gone.",
    "They walked along the beach, collecting shells and talking about the summer.",
    "The committee will meet again next month to discuss the budget.",
    "Our neighbour grows tomatoes in the garden and gives us the ones she cannot eat.",
    "The bridge was built in the nineteenth century and is still used every day.",
    "A small boat was waiting at the harbour to take the visitors to the island.",
]


@register_task("vader")
def vader_task(data_dir: str | None = None, eval_fraction: float = 0.25) -> Task:
    """Prompts split into train / validation; reward is VADER positivity in [0, 1]."""
    if not 0 < eval_fraction < 1:
        raise ConfigError(f"task.options.eval_fraction: expected in (0, 1), got {eval_fraction}")
    n_eval = max(1, int(len(PROMPTS) * eval_fraction))
    return Task(
        name="vader",
        train_prompts=PROMPTS[n_eval:],
        eval_prompts=PROMPTS[:n_eval],
        reward_fn=vader_positive,
        reference_texts=list(REFERENCE_TEXTS),
        pretrain_texts=list(PRETRAIN_TEXTS),
    )
