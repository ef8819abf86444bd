"""The medical rules of proxy.core.text.never_cache: the answer depends on a person's body. Symptoms,
dosages, drugs, diagnoses, test results, in English and Chinese, each a named pattern over the
lowercased, width-folded turn (``never_cache.fold``); medical reads the whole turn, material
handed over included, since pasted symptoms are still someone's body."""

from __future__ import annotations

import re
from typing import Final

from proxy.core.text.patterns import whole_words

__all__ = ["MEDICAL_RULES"]

_DRUG_EN: Final = (
    r"ibuprofen|advil|motrin|paracetamol|acetaminophen|tylenol|aspirin|naproxen|aleve|codeine|"
    r"tramadol|oxycodone|morphine|antibiotics?|amoxicillin|penicillin|azithromycin|doxycycline|"
    r"metformin|insulin|statins?|atorvastatin|lisinopril|amlodipine|warfarin|prednisone|"
    r"antidepressants?|sertraline|prozac|fluoxetine|xanax|melatonin|benadryl|antihistamines?|"
    r"cough syrup|birth control|contraceptive pills?|blood thinners?|painkillers?|pills?|tablets?|"
    r"medicines?|medications?|drugs?|supplements?|vitamin [a-z0-9]+|dayquil|nyquil|theraflu|sudafed|mucinex|"
    r"claritin|zyrtec|allegra|pepto(?:-bismol)?|tums|imodium|robitussin|midol|"
    # the stems drug names are built on: omeprazole, loratadine, ciprofloxacin, sumatriptan, ...
    r"[a-z]{3,}(?:cillin|mycin|cycline|prazole|azole|statin|sartan|profen|tadine|zepam|tidine|floxacin|"
    r"triptan|gliptin|oxetine|olol)"
)
_SYMPTOM_EN: Final = (
    r"headaches?|migraines?|fever|feverish|chills|cough(?:ing)?|sore throat|runny nose|"
    r"nausea|nauseous|vomit(?:ing)?|throwing up|diarrh(?:o)?ea|constipat(?:ed|ion)|dizz(?:y|iness)|"
    r"rash|hives|itch(?:y|ing)|swollen|swelling|bleeding|blood in (?:my|the) (?:urine|stool|poop)|chest pain|"
    r"(?:stomach|tummy|back|neck|ear|tooth|joint|knee|belly|abdominal|pelvic|jaw|hip|shoulder|wrist|ankle|foot|"
    r"feet|side|eye|arm|leg|hand|finger|toe|rib|groin|heel|muscle) ?(?:ache|pains?)|"
    r"(?:sharp|dull|stabbing|burning|shooting|throbbing|constant) pains?|pains? in my|puffy|"
    r"diabetes|asthma|epilepsy|hypertension|high blood pressure|arthritis|ibs|crohn's|celiac|copd|"
    r"short(?:ness)? of breath|palpitations|numb(?:ness)?|tingling|fatigue|insomnia|heartburn|acid reflux|"
    r"stiff (?:neck|back|joints?)|(?:a (?:bad |head |chest )?)cold|the flu|flu|covid|strep|pneumonia|bronchitis|"
    r"sinusitis|uti|"
    r"infection|infected|inflamed|sprain(?:ed)?|fractured?|cramps?|(?:a|this|the) (?:lump|mole|cyst|wart|bump) "
    r"(?:in|on|under)"
)
_BODY_ZH: Final = "头肚胃牙腰背胸嗓子喉咙关节腿膝脚手眼耳肩脖子颈椎小腹肚子心口"

MEDICAL_RULES: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "en_dose",
        re.compile(
            whole_words(
                r"dose|doses|dosage|dosing|overdose|\d+ ?mg|milligrams?|how many (?:pills|tablets|capsules)|"
                r"side effects?|drug interactions?|prescription|prescribed"
            )
            + "|"
            + whole_words(
                r"how much|how often|how many|can i take|should i take|safe to take|can i give|"
                r"mix|together with|combine"
            )
            + r".{0,40}"
            + whole_words(_DRUG_EN)
            + "|"
            + whole_words(r"(?:while|when|if i'm|if i am) on|on|off|stop taking|started taking|after taking")
            + " "
            + whole_words(_DRUG_EN)
            + "|"
            + whole_words(_DRUG_EN)
            + r".{0,30}"
            + whole_words(
                r"a day|per day|daily|how much|how many|at once|safe|"
                r"together|with alcohol|while pregnant|overdose"
            )
        ),
    ),
    (
        "en_symptom",
        re.compile(
            whole_words(
                r"symptoms?|i have|i've got|i've had|i got|i feel|i'm feeling|i am feeling|my (?:[a-z0-9'-]+ ){1,2}"
                r"(?:has|had|is|are|keeps|gets|got|feels|looks)|having|suffering from|keep getting|been getting|"
                r"ha(?:s|ve|d)|got|getting|feel(?:s|ing)?|felt|been|still|with"
            )
            + r".{0,40}"
            + whole_words(_SYMPTOM_EN)
            + "|"
            + whole_words(_SYMPTOM_EN)
            + r".{0,50}"
            + whole_words(
                r"what could it be|what is it|is it serious|should i worry|"
                r"see a doctor|go to the (?:er|hospital|doctor)|"
                r"what should i do|what does it mean|what causes|cause|worry about|be cancer|"
                r"for (?:\d+|two|three|a few|several) (?:days|weeks)"
            )
            + "|"
            + whole_words(r"hurts?|hurting|aches?|aching|sore|painful|pain when|pain in my|bleeds?")
            + "|"
            + whole_words(
                r"(?:is|are|it's|looks|feels|got) (?:really |very |a bit |all |so )?(?:swollen|bruised|infected|"
                r"inflamed|numb)|(?:twisted|sprained|broke|hurt|injured|cut|burned|burnt|bumped|pulled) my [a-z]+|"
                r"(?:my )?period (?:is|was) .{0,15}late|missed (?:my|a) period|i'm pregnant|i am pregnant|"
                r"(?:stung|bitten) by|"
                r"(?:swallowed|ingested|ate|drank) (?:a |an |some |the |my |two |three )?(?:[a-z]+ ){0,2}"
                r"(?:magnets?|batter(?:y|ies)|bleach|coins?|detergent|poison|pills?|pods?)"
            )
        ),
    ),
    (
        "en_diagnosis",
        re.compile(
            whole_words(
                r"symptoms?|signs of|diagnos(?:e|ed|is|es)|prognosis|"
                r"(?:do i|could i|might i) have (?:a |an |the )?(?:cancer|diabetes|"
                r"covid|flu|cold|[a-z]+itis|[a-z]+ (?:disease|syndrome|disorder|infection|deficiency))|could it be "
                r"(?:cancer|diabetes|covid|flu|an? [a-z]+ infection)|is it (?:cancer|contagious|an? allergy|an? "
                r"infection)|(?:blood|lab|medical|biopsy|mri|ct|x-ray|scan) (?:test )?results?|blood (?:test|work|"
                r"pressure|sugar|count)|white blood cells?|red blood cells?|cholesterol|glucose level|a1c|"
                r"biopsy|mri results?|x-ray results?|ecg|ekg|liver enzymes?|thyroid levels?|pregnan(?:t|cy) test|"
                r"should i see a doctor|need to see a doctor|go to the er|urgent care"
            )
        ),
    ),
    (
        "zh_dose",
        re.compile(
            r"剂量|药量|用药|服用|吃几片|一次吃几|一天吃几|一天最多|同时吃|副作用|处方|什么药|药物|过量服|孕妇能|哺乳期|"
            r"布洛芬|对乙酰氨基酚|扑热息痛|阿司匹林|阿莫西林|头孢|青霉素|抗生素|消炎药|退烧药|感冒药|降压药|降糖药|"
            r"胰岛素|安眠药|退热贴|退烧贴|止痛药|止疼药|褪黑素|维生素|钙片|激素药|中药|西药|药片|药膏|胶囊"
        ),
    ),
    (
        "zh_symptom",
        re.compile(
            rf"症状|(?:[{_BODY_ZH}]|膝盖|脚踝|手腕|后背|肩膀|牙齿|眼睛|肚脐|屁股|大腿|小腿|脚底|嘴巴|舌头)[又很好有点]?(?:疼|痛|酸|胀|麻|痒|肿)|"
            r"痒|起(?:了)?(?:疙瘩|包|红点|风团)|打嗝|耳鸣|口腔溃疡|长痘|掉头发|脱发|疼痛|发烧|发热|低烧|高烧|烧到|咳嗽|咳痰|流鼻涕|鼻塞|嗓子|喉咙痛|恶心|想吐|"
            r"口干|起夜|尿频|多尿|[腰脚手脖颈]扭了|扭了腰|闪了腰|呕吐|腹泻|拉肚子|便秘|便血|头晕|眩晕|胸闷|心慌|心悸|气短|喘不上气|皮疹|疹子|红疹|起疹|过敏|湿疹|瘙痒|发痒|"
            r"肿了|红肿|肿块|硬块|出血|流血|抽筋|乏力|没力气|失眠|盗汗|发炎|感染(?!力)|伤口|扭伤|骨折|烫伤|拉伤|"
            r"(?<!心)疼(?!爱)|干涩|酸胀|(?:摸着|摸起来|额头|身上|头)(?:有点|很|好)?烫|发烫|被.{0,4}烫|烫到|起了?水泡|崴了|崴脚|扭到|摔伤|割破|割伤|划破|淤青"
        ),
    ),
    (
        "zh_diagnosis",
        re.compile(
            r"诊断|确诊|病情|什么病|得了.{0,6}[症病炎]|(?:抑郁|焦虑|强迫|自闭|多动|糖尿|高血压|心脏|肺|肝|肾|胃|肠)(?:症|病|炎)|得了什么|是不是得了|要不要去医院|去医院|看医生|挂什么科|就医|"
            r"化验|检查报告|体检报告|化验单|偏高说明|偏低说明|转氨酶|白细胞|红细胞|血小板|血压|血糖|血脂|胆固醇|尿酸|"
            r"核磁|b超|彩超|心电图|甲状腺|肿瘤|癌|怀孕|验孕|月经|医生|医院"
        ),
    ),
)
